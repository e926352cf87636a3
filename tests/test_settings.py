"""One settings table (issue 31, item 4): every ``RLX_*`` variable rlx reads is listed
once with its parser, default, meaning and owner; plugins add theirs through the
contract (``Backend.settings``); every ``rlx`` command parses all of them before any
work; a typo of one is a warning naming it; a typo'd plugin name in
``RLX_DISABLE_PLUGINS`` is an error naming the known ones."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from support import ToyBackend, registry_with
from test_cli import assert_user_error, run_rlx

import rlx_core as rlx
from rlx_core.errors import ConfigError, PluginWarning, RlxWarning
from rlx_core.plugin import Setting
from rlx_core.run.settings import CORE_SETTINGS, INTERNAL_VARIABLES, all_settings, check_environment, plugin_settings

ROOT = Path(__file__).resolve().parents[1]
#: Read by a test suite or a benchmark, not by rlx itself.
NOT_RLX = {"RLX_FUZZ_EXAMPLES", "RLX_FUZZ_DEVICES", "RLX_FUZZ_PROFILE", "RLX_FUZZ_SAVE_DIR", "RLX_OPENCL_KIT_EXAMPLES"}


def variables_read_in(paths: list[Path]) -> set[str]:
    """Every ``RLX_*`` name that Python code under ``paths`` mentions in a string: what a
    setting could be read as (C macros like ``RLX_INF`` live in other files)."""
    found: set[str] = set()
    for path in paths:
        for file in path.rglob("*.py"):
            if "tests" in file.parts:
                continue
            found |= set(re.findall(r"""["'`=\s](RLX_[A-Z][A-Z0-9_]*[A-Z0-9])\b""", file.read_text(encoding="utf-8")))
    return found


class Tunable(ToyBackend):
    """A toy backend with a setting of its own."""

    MODE = Setting("RLX_TOY_MODE", "fast or exact (default exact)", choices={"fast": "fast", "exact": "exact"},
                   default="exact")

    def settings(self) -> tuple[Setting, ...]:
        return (self.MODE,)


# ----------------------------------------------------------------------------- the table
def test_the_table_lists_every_variable_rlx_reads() -> None:
    listed = {s.name for s in all_settings()} | set(INTERNAL_VARIABLES)
    read = variables_read_in([ROOT / "rlx_core", *(p for p in (ROOT / "plugins").iterdir() if p.is_dir())])
    # names that are not variables: native.c's macros, a constant, the typo settings.py's docstring shows
    macros = {"RLX_INF", "RLX_ABI", "RLX_CLONES", "RLX_FUSION_REPORT_HEADER", "RLX_DEVICS"}
    read = {v for v in read if not v.startswith(("RLX_PK_", "RLX_GEMM_", "RLX_CONV_"))} - macros
    assert read - NOT_RLX <= listed, sorted(read - NOT_RLX - listed)


def test_every_row_has_a_parser_a_default_a_line_and_an_owner() -> None:
    for s in all_settings():
        assert s.doc and "\n" not in s.doc and s.owner, s
        assert s.read({}) == s.default, s.name  # unset: the default
        assert s.read({s.name: "  "}) == s.default, s.name  # blank: the default
    assert {s.owner for s in CORE_SETTINGS} == {"rlx-core"}
    cpu = {s.name: s.owner for s in all_settings() if s.name.startswith("RLX_CPU_")}
    assert cpu == dict.fromkeys(["RLX_CPU_BLAS", "RLX_CPU_NATIVE", "RLX_CPU_GEMM", "RLX_CPU_CONV", "RLX_CPU_BIND",
                                 "RLX_CPU_ONEDNN", "RLX_CPU_LAYOUT", "RLX_CPU_SWISH", "RLX_CPU_BF16", "RLX_CPU_POOL_MB",
                                 "RLX_CPU_ANY_SIZE", "RLX_CPU_PER_IMAGE"],
                                "rlx-cpu")


@pytest.mark.parametrize("setting", CORE_SETTINGS, ids=lambda s: s.name)
def test_a_malformed_core_value_is_a_config_error_naming_variable_and_value(setting: Setting) -> None:
    bad = "@@ not valid @@" if setting.name != "RLX_CACHE_DIR" else "relative/cache"
    with pytest.raises(ConfigError) as info:
        setting.read({setting.name: bad})
    assert setting.name in str(info.value) and bad in str(info.value)


def test_values_are_typed() -> None:
    env = {"RLX_DEVICES": "cpu, cuda:1", "RLX_STRICT": "yes", "RLX_PROBE_TIMEOUT": "2.5", "RLX_BENCHMARK_PICK": "4",
           "RLX_ISOLATION": "0", "RLX_DISABLE_PLUGINS": "cuda"}
    values = {s.name: s.read(env) for s in CORE_SETTINGS}
    assert values["RLX_DEVICES"] == ("cpu", "cuda:1") and values["RLX_STRICT"] is True
    assert values["RLX_PROBE_TIMEOUT"] == 2.5 and values["RLX_BENCHMARK_PICK"] == 4
    assert values["RLX_ISOLATION"] is False and values["RLX_DISABLE_PLUGINS"] == frozenset({"cuda"})


def test_a_setting_is_declared_properly_or_not_at_all() -> None:
    with pytest.raises(ValueError, match="RLX_"):
        Setting("TOY_MODE", "x", choices={"a": 1})
    with pytest.raises(ValueError, match="one non-empty line"):
        Setting("RLX_TOY_MODE", "two\nlines", choices={"a": 1})
    with pytest.raises(ValueError, match="exactly one of parse and choices"):
        Setting("RLX_TOY_MODE", "x")
    with pytest.raises(ValueError, match="exactly one of parse and choices"):
        Setting("RLX_TOY_MODE", "x", parse=str, choices={"a": 1})


def test_choices_match_case_insensitively_and_say_what_they_accept() -> None:
    s = Tunable.MODE
    assert s.read({"RLX_TOY_MODE": " FAST "}) == "fast"
    with pytest.raises(ConfigError, match=r"^RLX_TOY_MODE: 'quick' is not accepted; expected one of fast, exact$"):
        s.read({"RLX_TOY_MODE": "quick"})


def test_a_parse_function_s_value_error_names_the_variable() -> None:
    def positive(text: str) -> int:
        if not text.isdigit():
            raise ValueError("expected a whole number of rows")
        return int(text)

    s = Setting("RLX_TOY_ROWS", "rows per block", parse=positive, default=8)
    assert s.read({"RLX_TOY_ROWS": "16"}) == 16
    with pytest.raises(ConfigError, match=r"^RLX_TOY_ROWS: 'many' is not accepted: expected a whole number of rows$"):
        s.read({"RLX_TOY_ROWS": "many"})


# ----------------------------------------------------------------------------- plugins' rows
def test_a_plugin_registers_its_settings_through_the_contract() -> None:
    reg = registry_with(ToyBackend("plain"), Tunable("tunable"))
    rows = plugin_settings(reg)
    assert [(s.name, s.owner) for s in rows] == [("RLX_TOY_MODE", "plugin tunable")]  # no distribution: named so
    assert rlx.Backend.settings(ToyBackend("plain")) == ()  # the default: a plugin written before it is unchanged
    with pytest.raises(ConfigError, match=r"RLX_TOY_MODE: 'quick'.*fast, exact"):
        check_environment({"RLX_TOY_MODE": "quick"}, reg)
    check_environment({"RLX_TOY_MODE": "fast"}, reg)


def test_a_plugin_s_bad_declarations_are_warned_about_and_left_out() -> None:
    class Raises(ToyBackend):
        def settings(self) -> tuple[Setting, ...]:
            raise RuntimeError("no settings today")

    class Garbage(ToyBackend):
        def settings(self) -> list[object]:
            return ["RLX_TOY_X", Setting("RLX_STRICT", "mine now", choices={"1": True})]

    reg = registry_with(Raises("raises"), Garbage("garbage"), Tunable("tunable"), Tunable("tunable2"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rows = plugin_settings(reg)
    said = " | ".join(str(w.message) for w in seen if issubclass(w.category, PluginWarning))
    assert "settings() raised RuntimeError: no settings today" in said
    assert "returned str, not an rlx_core.plugin.Setting" in said and "RLX_STRICT belongs to rlx-core" in said
    assert "RLX_TOY_MODE is already declared by plugin tunable" in said  # another plugin may not take it over
    assert [s.name for s in rows] == ["RLX_TOY_MODE"]


def test_rlx_cpu_s_garbage_is_an_error_naming_variable_value_and_accepted() -> None:
    for var, accepted in [("RLX_CPU_GEMM", "auto, native, blas"), ("RLX_CPU_CONV", "auto, implicit, im2col"),
                          ("RLX_CPU_BLAS", "auto, mkl"), ("RLX_CPU_NATIVE", "1, on"), ("RLX_CPU_BIND", "0, off")]:
        with pytest.raises(ConfigError) as info:
            check_environment({var: "garbage"})
        assert str(info.value).startswith(f"{var}: 'garbage' is not accepted; expected one of ")
        assert all(word in str(info.value) for word in accepted.split(", ")), str(info.value)


# ----------------------------------------------------------------------------- typos
def test_a_typo_of_a_variable_is_a_warning_naming_the_one_meant() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check_environment({"RLX_DEVICS": "cpu", "RLX_CPU_BLA": "numpy", "RLX_FUZZ_DEVICES": "cpu",
                           "RLX_SOMETHING_ELSE": "1", "RLX_ISOLATION_CHILD": "1"})
    said = sorted(str(w.message) for w in seen if issubclass(w.category, RlxWarning))
    assert said == ["RLX_CPU_BLA is not a variable rlx reads; did you mean RLX_CPU_BLAS? (RLX_CPU_BLA is ignored)",
                    "RLX_DEVICS is not a variable rlx reads; did you mean RLX_DEVICES? (RLX_DEVICS is ignored)"]


def test_a_typo_in_disable_plugins_is_an_error_naming_the_known_plugins() -> None:
    with pytest.raises(ConfigError) as info:
        check_environment({"RLX_DISABLE_PLUGINS": "cpu,opencll"})
    message = str(info.value)
    assert message.startswith("RLX_DISABLE_PLUGINS: 'opencll' is not a plugin here; did you mean 'opencl'?")
    assert "cpu" in message and "cuda" in message  # the known ones, rlx's own included
    check_environment({"RLX_DISABLE_PLUGINS": "cuda,opencl,jax,tpu"})  # rlx's own: fine, installed or not


# ----------------------------------------------------------------------------- every command, before any work
@pytest.mark.parametrize("args", [["devices"], ["run", "--example", "mlp"], ["check", "GRAPH"],
                                  ["bench", "--example", "mlp", "--runs", "1"], ["calibrate", "cpu", "--quick"]])
def test_every_command_parses_the_plugins_settings_before_any_work(tmp_path: Path, args: list[str]) -> None:
    rlx.Graph.from_json((Path(rlx.__file__).parent / "examples" / "mlp.json").read_text()).save(tmp_path / "g.json")
    args = [str(tmp_path / "g.json") if a == "GRAPH" else a for a in args]
    proc = run_rlx(*args, cwd=tmp_path, env={"RLX_CPU_GEMM": "nativ"})
    assert_user_error(proc, "RLX_CPU_GEMM", "'nativ'", "auto, native, blas")
    assert proc.stdout == ""


def test_a_command_warns_about_a_typo_once_and_goes_on(tmp_path: Path) -> None:
    proc = run_rlx("devices", "--json", cwd=tmp_path, env={"RLX_DEVICS": "cpu"})
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "RLX_DEVICS" in line]
    assert warned == ["warning: RLX_DEVICS is not a variable rlx reads; did you mean RLX_DEVICES? (RLX_DEVICS is "
                      "ignored)"]


def test_explain_lists_the_plugins_settings_with_their_owner(tmp_path: Path) -> None:
    import json

    proc = run_rlx("devices", "--explain", cwd=tmp_path, env={"RLX_CPU_GEMM": "blas"})
    assert proc.returncode == 0, proc.stderr
    assert "RLX_CPU_GEMM='blas' [rlx-cpu] — float32 products" in " ".join(proc.stdout.split())
    doc = json.loads(run_rlx("devices", "--json", cwd=tmp_path).stdout)
    rows = {r["variable"]: r for r in doc["environment"]}
    assert rows["RLX_CPU_BIND"]["owner"] == "rlx-cpu" and rows["RLX_STRICT"]["owner"] == "rlx-core"


# ----------------------------------------------------------------------------- documented
def test_the_readme_lists_every_core_variable_and_the_plugin_guide_says_how_to_add_one() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [s.name for s in CORE_SETTINGS if f"`{s.name}`" not in readme]
    assert not missing, missing
    guide = (ROOT / "docs" / "writing-a-plugin.md").read_text(encoding="utf-8")
    assert "def settings(self)" in guide and "Setting(" in guide
