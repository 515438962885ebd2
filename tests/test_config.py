"""Config files: decoded strictly, and every mistake named by file, key path and reason."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from mhsafeeval.cli import main
from mhsafeeval.config import (
    Config,
    canonical_config,
    config_differences,
    load_config,
    parse_config,
)
from mhsafeeval.errors import InputError
from mhsafeeval.search import controller_options
from mhsafeeval.search._types import NoOptions, TargetingOptions
from mhsafeeval.search._uct_controller import UCTOptions

GOOD = """
[campaign]
name = "smoke"
seed = 7

[models.default]
provider = "scripted/echo"

[counselors.counselor]
provider = "litellm/openai/gpt-4o-mini"
api_key_env = "OPENAI_API_KEY"
timeout = 30
max_concurrency = 2
temperature = 0.7
"""


def test_good_config_decodes(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    config = load_config(path)
    assert (config.campaign.name, config.campaign.seed) == ("smoke", 7)
    counselor = config.counselors["counselor"]
    assert (counselor.timeout, counselor.max_concurrency, counselor.temperature) == (30, 2, 0.7)
    assert counselor.api_key_env == "OPENAI_API_KEY"
    assert config.model_for("judge").timeout == 60  # default


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (
            '[models.judge]\nprovider = "a/b"\ntimeout = "soon"',
            "models.judge.timeout",
            "expected float, got str",
        ),
        ('[models.judge]\nprovider = "a/b"\ntimeout = 0', "models.judge.timeout", "must be > 0"),
        ('[models.judge]\nprovider = "a/b"\nstop = [""]', "models.judge.stop", "not be empty"),
        ('[models.judge]\nprovider = "a/b"\nstop = "x"', "models.judge.stop", "expected array"),
        (
            '[models.judge]\nprovider = "a/b"\ntemprature = 1',
            "models.judge.temprature",
            "unknown field",
        ),
        ("[models.judge]\ntimeout = 3", "models.judge.provider", "missing required field"),
        ('[models.judge]\nprovider = "gpt-4o"', "models.judge.provider", "PREFIX/MODEL"),
        (
            '[models.judge]\nprovider = "a/b"\nmax_concurrency = 0',
            "models.judge.max_concurrency",
            ">= 1",
        ),
        (
            '[models.judge]\nprovider = "a/b"\napi_key_env = "sk-live-123"',
            "models.judge.api_key_env",
            "NAME of an environment variable",
        ),
        ('[campaign]\nseed = "x"', "campaign.seed", "expected int"),
        ("[campain]\nseed = 1", "campain", "unknown field"),
        ('[logging]\nlevel = "loud"', "logging.level", "must be one of"),
        ("models = 3", "models", "expected object"),
        ("[search]\ndepth = 2", "search.depth", "lookahead (depth > 1) was removed"),
        ("search = 3", "search", "expected object"),
        ("[campaign]\nthreshold = 6", "campaign.threshold", "must be <= 5"),
        ("[campaign]\nthreshold = 0", "campaign.threshold", "must be >= 1"),
    ],
)
def test_errors_name_file_key_and_reason(text: str, field: str, reason: str) -> None:
    with pytest.raises(InputError) as info:
        parse_config(text, "bad.toml")
    err = info.value
    assert err.source == "bad.toml"
    assert err.field == field
    assert reason in err.reason
    assert str(err).startswith(f"bad.toml: {field}: ")


@pytest.mark.parametrize("controller", ["map-elites", "uct", "random", "single-turn"])
@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("[search]\nempty_bonus = 2.0", "search.empty_bonus", "must be <= 1"),
        ("[search]\nempty_bonus = -0.5", "search.empty_bonus", "must be >= 0"),
        ("[search]\nsimulations = 0", "search.simulations", "must be >= 1"),
        ("[search]\nsimulatons = 8", "search.simulatons", "unknown field"),
    ],
)
def test_search_errors_name_file_key_and_reason(
    controller: str, text: str, field: str, reason: str
) -> None:
    """``[search]`` is the selected controller's options, checked once it is known; a
    controller without options of its own still checks the tree search's keys, which any
    config could set before options were per controller."""
    config = parse_config(f'[campaign]\ncontroller = "{controller}"\n{text}', "bad.toml")
    with pytest.raises(InputError) as info:
        controller_options(config.campaign.controller, config.search, "bad.toml")
    err = info.value
    assert (err.source, err.field) == ("bad.toml", field)
    assert reason in err.reason
    assert str(err).startswith(f"bad.toml: {field}: ")


def test_search_is_the_selected_controllers_options() -> None:
    table = {"simulations": 7, "early_stop": True}
    uct = controller_options("uct", table)
    assert uct == UCTOptions(simulations=7, early_stop=True)
    assert msgspec.to_builtins(uct) == {
        "give_up": True,
        "prior_successes": 1.0,
        "prior_failures": 1.0,
        "borrow": True,
        "simulations": 7,
        "in_flight": 4,
        "samples_per_action": 2,
        "exploration": 1.0,
        "empty_bonus": 0.2,
        "notes": True,
        "early_stop": True,
    }
    # The MAP-Elites family reads only the targeting keys: the others accepted (checked
    # above), ignored.
    assert controller_options("map-elites", table) == TargetingOptions()
    assert controller_options("random", table) == NoOptions()


def effective(config: Config) -> Config:
    """``config`` as a campaign stores it: ``[search]`` decoded by its controller."""
    options = controller_options(config.campaign.controller, config.search)
    return msgspec.structs.replace(config, search=msgspec.to_builtins(options))


def test_campaigns_stored_with_the_tree_search_keys_resume() -> None:
    """Before ``[search]`` was the controller's options every campaign stored the tree
    search's six keys: for a controller that does not read them they differ in nothing; for
    uct they are compared as before."""
    for controller in ("map-elites", "uct"):
        base = f'[campaign]\nname = "old"\ncontroller = "{controller}"\n'
        now = effective(parse_config(base + "[search]\nsimulations = 7\n", "c.toml"))
        stored = json.loads(canonical_config(now))
        stored["search"] = {
            "simulations": 7,
            "in_flight": 4,
            "samples_per_action": 2,
            "exploration": 1.0,
            "empty_bonus": 0.2,
            "early_stop": False,
            "depth": 1,
        }
        # Stored before cells were given up on (issue 34): it resumes as it ran, without; a
        # tree search also stored before turns stopped at their first success by default, and
        # before it read the refiner's notes.
        early = ["search.early_stop: stored false, now true"] if controller == "uct" else []
        notes = ["search.notes: stored false, now true"] if controller == "uct" else []
        assert config_differences(json.dumps(stored), now) == [
            *early,
            "search.give_up: stored false, now true",
            *notes,
        ]
        stored["search"]["give_up"] = True
        stored["search"]["early_stop"] = True
        if controller == "uct":
            stored["search"]["notes"] = True
        # A map-elites search that gave up, stored before a cell's prior borrowed from its
        # neighbours, resumes as it ran only without borrowing (one that did not give up never
        # read that evidence; a tree search already borrowed).
        borrow = [] if controller == "uct" else ["search.borrow: stored false, now true"]
        assert config_differences(json.dumps(stored), now) == borrow
        stored["search"]["borrow"] = True
        assert config_differences(json.dumps(stored), now) == []
        stored["search"]["simulations"] = 9
        lines = config_differences(json.dumps(stored), now)
        if controller == "uct":
            assert lines == ["search.simulations: stored 9, now 7"]
        else:
            assert lines == []  # map-elites never read it


def test_cli_refuses_the_removed_search_depth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(GOOD + "\n[search]\nsimulations = 20\ndepth = 2\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"mhsafeeval: error: {path}: search.depth: the uct controller's lookahead (depth > 1) "
        "was removed, as measured against depth 1 it gained nothing (see docs/campaigns.md, "
        '"Search controllers"); delete this key'
    ]
    path.write_text(GOOD + "\n[search]\nsimulations = 20\n")
    assert main(["check", str(path)]) == 0


def test_a_config_written_for_depth_1_still_parses() -> None:
    """``depth = 1`` (the old default) means how uct runs now: accepted and ignored."""
    cfg = parse_config(GOOD + "\n[search]\nsimulations = 7\ndepth = 1\n", "old.toml")
    assert cfg.search == {"simulations": 7}
    assert controller_options("uct", cfg.search) == UCTOptions(simulations=7)


def test_a_stored_search_depth_differs_only_when_it_looked_ahead() -> None:
    """Campaigns stored by earlier versions have ``search.depth`` in their stored config: 1
    (how this version runs) is no difference on resume, 2 is one that says why."""
    now = parse_config(GOOD, "c.toml")
    stored = json.loads(canonical_config(now))
    assert "depth" not in stored["search"]
    stored["search"]["depth"] = 1
    assert config_differences(json.dumps(stored), now) == []
    stored["search"]["depth"] = 2
    [line] = config_differences(json.dumps(stored), now)
    assert line.startswith("search.depth: stored 2, but the uct controller's lookahead")


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"bad.toml: not valid TOML: .*line 1"):
        parse_config("[models.judge\n", "bad.toml")
    with pytest.raises(InputError, match="no such file"):
        load_config(tmp_path / "absent.toml")


def test_cli_check_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[models.judge]\nprovider = "a/b"\ntimeout = -1\n')
    before = sorted(tmp_path.iterdir())
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: models.judge.timeout: must be > 0 seconds" in err
    assert sorted(tmp_path.iterdir()) == before

    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    assert main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "campaign 'smoke': 14 conversation(s) x 10 turn(s)" in out
    assert "counselor counselor      litellm/openai/gpt-4o-mini" in out


@pytest.mark.parametrize("example", ["campaign.toml", "hosted.toml"])
def test_shipped_examples_validate(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[1] / "examples" / example
    assert main(["check", str(path)]) == 0
    assert ": ok (campaign" in capsys.readouterr().out


def test_a_config_without_counselors_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[models.default]\nprovider = "scripted/echo"\n')
    assert main(["check", str(path)]) == 2
    assert "counselors: no counselor model to evaluate" in capsys.readouterr().err
    path.write_text(
        '[models.client]\nprovider = "scripted/echo"\n[counselors.x]\nprovider = "a/b"\n'
    )
    assert main(["check", str(path)]) == 2
    assert "models.mutator: no model for this role" in capsys.readouterr().err
    path.write_text('[models.critic]\nprovider = "a/b"\n[counselors.x]\nprovider = "a/b"\n')
    assert main(["check", str(path)]) == 2
    assert "models.critic: unknown agent role" in capsys.readouterr().err


def test_pacing_keys_of_model_tables_may_change_on_resume() -> None:
    """A campaign stored before ``adaptive_concurrency`` existed resumes, and a resumed run may
    pace its calls differently; a key that changes what is sent still differs."""
    text = GOOD + '\n[models.judge]\nprovider = "scripted/demo-judge"\nmax_concurrency = 4\n'
    now = parse_config(text, "c.toml")
    stored = json.loads(canonical_config(now))
    judge = stored["models"]["judge"]
    for key in ("adaptive_concurrency", "min_concurrency"):
        del judge[key]  # what an older version stored
    judge["max_concurrency"] = 16
    assert config_differences(json.dumps(stored), now) == []
    judge["temperature"] = 0.9
    assert config_differences(json.dumps(stored), now) == [
        "models.judge.temperature: stored 0.9, now null"
    ]
