"""The provider contract: declared options checked by `check`, and a ModelClient protocol that
callers use without reaching into a concrete wrapper (sampling, price, retries, connections)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec
import pytest

from mhsafeeval.budget import Budget, BudgetedModel
from mhsafeeval.cli import main
from mhsafeeval.config import BudgetSection
from mhsafeeval.costs import model_cost
from mhsafeeval.judges import RubricJudge
from mhsafeeval.providers import (
    CallParams,
    ChatMessage,
    Completion,
    Connections,
    ModelCallError,
    ModelClient,
    ModelSettings,
    ScriptedModel,
    TransientProviderError,
    open_model,
    provider,
)
from mhsafeeval.providers._litellm import LiteLLMOptions
from mhsafeeval.providers._local import LocalModel, LocalOptions
from mhsafeeval.providers._registry import provider_info
from mhsafeeval.providers._scripted import ScriptedOptions
from mhsafeeval.providers._vllm import VllmOptions
from mhsafeeval.taxonomy import builtin_taxonomy
from mhsafeeval.testing import register_script
from needs import need_module

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "examples" / "campaign.toml").read_text()
JUDGE = '[models.judge]\nprovider = "scripted/demo-judge"\n'
HELLO = [ChatMessage("user", "hello")]


# -- every built-in provider declares its options; `check` refuses a bad one with exit 2 -------


@pytest.mark.parametrize(
    ("prefix", "options"),
    [
        ("scripted", ScriptedOptions),
        ("litellm", LiteLLMOptions),
        ("local", LocalOptions),
        ("vllm", VllmOptions),
    ],
)
def test_every_builtin_provider_declares_its_options_and_a_check(
    prefix: str, options: type[msgspec.Struct]
) -> None:
    info = provider_info(prefix)
    assert info.options is options
    assert info.check is not None


def judge_config(tmp_path: Path, table: str) -> Path:
    assert JUDGE in BASE
    path = tmp_path / "c.toml"
    path.write_text(BASE.replace(JUDGE, "[models.judge]\n" + table + "\n"))
    return path


@pytest.mark.parametrize(
    ("table", "where", "reason"),
    [
        # Found by the declared options Struct of each provider.
        ('provider = "scripted/echo"\noptions = { delay = 1 }', "options.delay", "unknown"),
        ('provider = "scripted/echo"\noptions = { replies = [] }', "options.replies", "length"),
        ('provider = "local/gemma-3-270m"\noptions = { n_ctx = 10 }', "options.n_ctx", ">= 256"),
        (
            'provider = "litellm/openai/gpt-4o-mini"\noptions = { extra_body = "x" }',
            "options.extra_body",
            "expected object",
        ),
        (
            'provider = "litellm/openai/gpt-4o-mini"\noptions = { metadata = 3 }',
            "options.metadata",
            "expected object",
        ),
        (
            'provider = "litellm/openai/gpt-4o-mini"\noptions = { drop_params = "yes" }',
            "options.drop_params",
            "expected bool",
        ),
        # Found by each provider's declared check, without opening anything.
        ('provider = "scripted/no-such-script"', "provider", "no script named 'no-such-script'"),
        ('provider = "local/no/such/model.gguf"', "provider", "no model file at no/such"),
    ],
)
def test_check_and_run_refuse_a_bad_provider_setting_naming_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, where: str, reason: str
) -> None:
    if "local/no/such" in table:  # without llama.cpp, check says that first
        need_module("llama_cpp", "pip install -e '.[local]'")
    config = judge_config(tmp_path, table)
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mhsafeeval: error: {config}: models.judge.{where}: "), err
    assert reason in err, err
    # `run` refuses the same before writing anything, never failing later with exit 1.
    assert main(["run", str(config), "--db", str(tmp_path / "c.db"), "--quiet"]) == 2
    assert capsys.readouterr().err == err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_a_gguf_file_that_is_not_one_is_refused_by_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"<html>not a model</html>")
    config = judge_config(tmp_path, f'provider = "local/{fake}"')
    assert main(["check", str(config)]) == 2
    assert "models.judge.provider: " in capsys.readouterr().err


def test_a_registered_provider_s_declarations_are_checked() -> None:
    class Options(msgspec.Struct, forbid_unknown_fields=True):
        depth: int = 1

    def no_zero(model: str, settings: ModelSettings) -> list[tuple[str, str]]:
        return [("provider", "model 0 is reserved")] if model == "0" else []

    @provider("contract-test", options=Options, check=no_zero)
    def make(model: str, settings: ModelSettings) -> ScriptedModel:
        """For this test."""
        return ScriptedModel(model, ["x"])

    info = provider_info("contract-test")
    assert (info.factory, info.options, info.check) == (make, Options, no_zero)
    with pytest.raises(ValueError, match=r"options\.depth"):
        open_model(ModelSettings(provider="contract-test/a", options={"depth": "deep"}))
    with pytest.raises(ValueError, match="model 0 is reserved"):
        open_model("contract-test/0")
    assert open_model("contract-test/a").name == "scripted/a"


# -- the protocol: every built-in client speaks all of it ----------------------------------------


def builtin_clients(tmp_path: Path) -> list[ModelClient]:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")  # LocalModel loads its file on the first call, never here
    litellm = ModelSettings(provider="litellm/openai/gpt-4o-mini", options={"mock_response": "hi"})
    return [
        ScriptedModel("echo", ["x"]),
        LocalModel(str(gguf), gguf, ModelSettings(provider=f"local/{gguf}")),
        open_model(litellm).inner,
        open_model(ModelSettings(provider="scripted/echo", temperature=0.4)),
    ]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # litellm is asyncio-only
async def test_every_builtin_client_speaks_the_whole_protocol(tmp_path: Path) -> None:
    done = Completion(text="x", finish_reason="stop", prompt_tokens=10, completion_tokens=10)
    for client in builtin_clients(tmp_path):
        assert isinstance(client, ModelClient), client
        assert isinstance(client.sampling, CallParams)
        assert client.connection_key
        assert client.should_retry(TransientProviderError("429", status=429))
        assert not client.should_retry(ValueError("a bug"))
        assert client.price(done) is not None
        await client.aclose()


def test_sampling_is_what_the_table_configured() -> None:
    settings = ModelSettings(provider="scripted/echo", temperature=0.4, seed=3, stop=("END",))
    assert open_model(settings).sampling == CallParams(temperature=0.4, seed=3, stop=("END",))
    assert open_model("scripted/echo").sampling == CallParams()
    assert ScriptedModel("echo", []).sampling == CallParams()  # applies none of its own


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # litellm is asyncio-only
async def test_a_litellm_model_prices_its_answers_like_the_price_map() -> None:
    settings = ModelSettings(provider="litellm/openai/gpt-4o-mini", options={"mock_response": "hi"})
    async with open_model(settings) as model:
        dated = Completion(
            text="x",
            finish_reason="stop",
            prompt_tokens=10_000,
            completion_tokens=500,
            model="gpt-4o-mini-2099-12-31-unlisted",  # priced as the configured model
        )
        expected = model_cost("openai/gpt-4o-mini", 10_000, 500)
        assert expected is not None and expected > 0
        assert model.price(dated) == pytest.approx(expected)
    assert ScriptedModel("echo", []).price(dated) == 0.0


# -- retries: the provider decides ---------------------------------------------------------------


class Choosy(ScriptedModel):
    """Retries only the errors it names."""

    def __init__(self, script: Sequence[object], retry: type[Exception]) -> None:
        super().__init__("choosy", script)  # type: ignore[arg-type]
        self.retry = retry

    def should_retry(self, error: Exception) -> bool:
        return isinstance(error, self.retry)


class Flaky(Exception):
    """Not a provider error: only this provider knows it is worth retrying."""


@pytest.fixture
def choosy() -> list[Choosy]:
    made: list[Choosy] = []

    @provider("choosy", replace=True)
    def make(model: str, settings: ModelSettings) -> Choosy:
        retry = Flaky if model == "flaky" else KeyError
        made.append(Choosy([TransientProviderError("503"), Flaky("blip"), "done"], retry))
        return made[-1]

    return made


async def no_sleep(seconds: float) -> None:
    await anyio.lowlevel.checkpoint()


async def test_the_provider_decides_what_is_retried(choosy: list[Choosy]) -> None:
    # This provider does not retry a TransientProviderError: one attempt, still retryable later.
    model = open_model(ModelSettings(provider="choosy/strict", max_attempts=5), sleep=no_sleep)
    with pytest.raises(ModelCallError, match="503") as info:
        await model.complete(HELLO)
    assert (info.value.attempts, info.value.retryable) == (1, True)
    assert len(choosy[-1].calls) == 1
    # ... and this one retries an error of its own that is no provider error.
    model = open_model(ModelSettings(provider="choosy/flaky", max_attempts=5), sleep=no_sleep)
    with pytest.raises(ModelCallError, match="503"):
        await model.complete(HELLO)
    assert (await model.complete(HELLO)).text == "done"  # "blip" was retried, then "done"
    assert model.stats.attempts == 3
    assert model.should_retry(Flaky()) and not model.should_retry(KeyError())


# -- connections: one limit per endpoint ---------------------------------------------------------


async def test_tables_on_one_endpoint_share_one_limit_as_wide_as_the_widest() -> None:
    shared = Connections()
    gate = anyio.Event()
    in_flight = peak = 0

    async def slow(messages: Sequence[ChatMessage], params: CallParams) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await gate.wait()
        in_flight -= 1
        return "ok"

    register_script("endpoint", slow)
    cold = open_model(
        ModelSettings(provider="scripted/endpoint", max_concurrency=2), connections=shared
    )
    warm = open_model(
        ModelSettings(provider="scripted/endpoint", temperature=1.0, max_concurrency=3),
        connections=shared,
    )
    other = open_model(ModelSettings(provider="scripted/echo"), connections=shared)
    alone = open_model(ModelSettings(provider="scripted/endpoint", max_concurrency=2))
    assert cold.limiter is warm.limiter and cold.limiter.total_tokens == 3
    assert other.limiter is not cold.limiter and alone.limiter is not cold.limiter
    assert shared.keys() == ["scripted:endpoint", "scripted:echo"]
    async with anyio.create_task_group() as tg:
        for model in (cold, warm) * 3:
            tg.start_soon(model.complete, HELLO)
        await anyio.wait_all_tasks_blocked()
        assert peak == 3  # six calls on one endpoint, three at a time
        gate.set()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # litellm is asyncio-only
async def test_litellm_tables_share_a_connection_by_server_model_and_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONTRACT_KEY_A", "sk-a")
    monkeypatch.setenv("CONTRACT_KEY_B", "sk-b")
    base = "http://127.0.0.1:8000/v1"
    opened: list[ModelClient] = []

    def key(**kw: object) -> str:
        settings = ModelSettings(provider="litellm/hosted_vllm/m", **kw)  # type: ignore[arg-type]
        opened.append(open_model(settings))
        return opened[-1].connection_key

    try:
        assert key(api_base=base) == key(api_base=base + "/", temperature=0.9, timeout=5)
        assert key(api_base=base) != key(api_base="http://127.0.0.1:8001/v1")
        assert key(api_base=base) != key(api_base=base, api_key_env="CONTRACT_KEY_A")
        assert key(api_base=base, api_key_env="CONTRACT_KEY_A") != key(
            api_base=base, api_key_env="CONTRACT_KEY_B"
        )
        assert "sk-a" not in key(api_base=base, api_key_env="CONTRACT_KEY_A")  # names only
    finally:
        for model in opened:
            await model.aclose()


def test_local_tables_share_a_connection_by_model_file(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    a = LocalModel("a", gguf, ModelSettings(provider=f"local/{gguf}"))
    b = LocalModel("b", tmp_path / "." / "m.gguf", ModelSettings(provider=f"local/{gguf}"))
    assert a.connection_key == b.connection_key == str(gguf.resolve())


# -- callers use only the protocol ---------------------------------------------------------------


class Bare:
    """A ModelClient implemented from scratch: no ``settings`` attribute to reach into."""

    name = "bare/model"
    supports_json_schema = True
    sampling = CallParams(temperature=0.6)
    connection_key = "bare"

    def should_retry(self, error: Exception) -> bool:
        return False

    def price(self, completion: Completion) -> float | None:
        return 0.25

    async def complete(
        self, messages: Sequence[ChatMessage], params: CallParams | None = None
    ) -> Completion:
        return Completion(text="hi", finish_reason="stop", prompt_tokens=3, model="bare-v2")

    async def aclose(self) -> None:
        pass


async def test_a_budget_prices_answers_through_the_client() -> None:
    budget = Budget(BudgetSection(usd=10.0))
    model = BudgetedModel(Bare(), budget, counselor=True)
    assert isinstance(model, ModelClient)
    assert (model.sampling, model.connection_key) == (Bare.sampling, "bare")
    assert model.price(await model.complete(HELLO)) == 0.25
    await model.complete(HELLO)
    assert budget.usd == pytest.approx(0.5) and budget.tokens == 6


def test_the_judge_reads_the_configured_temperature_through_the_protocol() -> None:
    assert RubricJudge(Bare(), builtin_taxonomy()).params == CallParams()  # 0.6 wins
    greedy = RubricJudge(ScriptedModel("judge", []), builtin_taxonomy()).params
    assert greedy == CallParams(temperature=0.0)
    budgeted = BudgetedModel(Bare(), Budget(BudgetSection()), counselor=False)
    assert RubricJudge(budgeted, builtin_taxonomy()).params == CallParams()


# -- the scripted provider has its scripts where it lives ----------------------------------------


def test_demo_scripts_open_without_importing_the_testing_package() -> None:
    code = (
        "import sys\n"
        "from mhsafeeval.providers import open_model\n"
        "open_model('scripted/demo-judge')\n"
        "print('mhsafeeval.testing' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    source = (ROOT / "src/mhsafeeval/providers/_scripted.py").read_text()
    assert "import_module" not in source
    assert not re.search(r"^\s*(from|import) mhsafeeval\.testing", source, re.MULTILINE)
