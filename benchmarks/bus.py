"""Messages per second through the runtime's bus.

Three shapes: five agents passing a token around a ring (one conversation); 100 concurrent
conversations, each a ring of five per-conversation agent instances; and conversation churn,
waves of 128 short conversations (five agent instances each, one message per instance, then
``end_conversation``), as a campaign of one-turn conversations makes them. Prints the figures;
the target is >= 50,000 messages/s on a 2-core machine, so that the bus never matters next to
LLM calls, and the churn's CPU per conversation (its mailbox tasks are handed on from one
conversation to the next on asyncio: about half what a task per mailbox cost).

    python benchmarks/bus.py [--hops 200000] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import time

import anyio

from mhsafeeval.framework import Agent, AgentId, Message, Runtime, on

RING = 5


class Token(Message, frozen=True, tag="bench.token"):
    station: int
    hops_left: int


class Station(Agent):
    """Passes the token to the next station until it has no hops left."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    @on(Token)
    def forward(self, msg: Token) -> None:
        if msg.hops_left == 0:
            return
        nxt = (self.index + 1) % RING
        self.publish(
            Token(
                campaign=msg.campaign,
                conversation=msg.conversation,
                key=str(msg.hops_left),
                station=nxt,
                hops_left=msg.hops_left - 1,
            ),
            topic=f"station{nxt}",
        )


class Counter:
    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, msg: Message) -> None:
        self.seen += 1


async def ring(hops: int) -> tuple[float, int]:
    """Five global agents, each subscribed to its own topic: one delivery per message."""
    async with Runtime() as rt:
        for i in range(RING):
            rt.add(Station(i), name=f"station{i}", topic=f"station{i}")
        start = time.perf_counter()
        rt.publish(
            Token(campaign="bench", conversation="c0", station=0, hops_left=hops), topic="station0"
        )
        await rt.run_until_idle()
        elapsed = time.perf_counter() - start
    return elapsed, rt.published


class RingMember(Agent):
    """A per-conversation station: five agent types, one instance of each per conversation."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    forward = Station.forward


def member_factory(index: int) -> type[Agent] | object:
    def make(_: AgentId) -> Agent:
        return RingMember(index)

    return make


async def conversations(n: int, hops_each: int, observe: bool) -> tuple[float, int, int]:
    async with Runtime() as rt:
        for i in range(RING):
            rt.register(f"member{i}", member_factory(i), types=(Token,), topic=f"station{i}")  # type: ignore[arg-type]
        counter = Counter()
        if observe:
            rt.subscribe(counter, name="observer")
        start = time.perf_counter()
        for c in range(n):
            rt.publish(
                Token(campaign="bench", conversation=f"c{c}", station=0, hops_left=hops_each),
                topic="station0",
            )
        await rt.run_until_idle()
        elapsed = time.perf_counter() - start
    return elapsed, rt.published, counter.seen


async def churn(waves: int, per_wave: int) -> tuple[float, int]:
    """CPU seconds for ``waves`` x ``per_wave`` conversations of five one-message instances."""
    async with Runtime() as rt:
        for i in range(RING):
            rt.register(f"member{i}", member_factory(i), types=(Token,), topic=f"station{i}")  # type: ignore[arg-type]
        start = time.process_time()
        for wave in range(waves):
            names = [f"w{wave}c{c}" for c in range(per_wave)]
            for name in names:
                rt.publish(
                    Token(campaign="bench", conversation=name, station=0, hops_left=RING - 1),
                    topic="station0",
                )
            await rt.run_until_idle()
            for name in names:
                rt.end_conversation(name)
            await rt.run_until_idle()
        elapsed = time.process_time() - start
    return elapsed, rt.tasks_started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=int, default=100_000)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = parser.parse_args()

    elapsed, published = anyio.run(ring, args.hops, backend=args.backend)
    print(
        f"ring of {RING} agents           : {published:>8} published in {elapsed:6.2f}s = "
        f"{published / elapsed:>9,.0f} msg/s"
    )
    n = 100
    for observe in (False, True):
        elapsed, published, seen = anyio.run(
            conversations, n, args.hops // n, observe, backend=args.backend
        )
        label = "100 conversations + observer" if observe else "100 conversations         "
        print(
            f"{label}: {published:>8} published in {elapsed:6.2f}s = "
            f"{published / elapsed:>9,.0f} msg/s" + (f" (observer saw {seen})" if observe else "")
        )
    waves, per_wave = 40, 128
    cpu, started = anyio.run(churn, waves, per_wave, backend=args.backend)
    total = waves * per_wave
    print(
        f"churn, {total} conversations : {cpu:6.2f}s CPU = {1e6 * cpu / total:4.0f} us per "
        f"conversation of {RING} agents ({started} mailbox tasks started)"
    )


if __name__ == "__main__":
    main()
