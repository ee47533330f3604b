"""The shared front of every `python -m pipelines.<command>`: Hydra entry, one-line errors, Ctrl-C.

A user's mistake (a misspelled key, a group option that does not exist, a missing `???` value, a
file where a folder belongs, a push without a token) ends the command with ONE line on stderr,
`error: <what and what would be valid>`, and exit code 2; Ctrl-C ends it with one line saying what
was kept, exit code 130. A bug still gets its traceback.

Why a wrapper around `hydra.main` rather than Hydra's own error path: Hydra reports an unknown key
as "Could not override 'n_task'. To append to your config use +n_task=5" (exit 1), which sends the
user to add a key the program then refuses. So the overrides are composed here first, exactly as
Hydra will compose them, and a key Hydra does not know is either
  - a field of the command's dataclass that the group's YAML does not list (`verify.cpu_max_ms`
    under `verify=auto`): accepted, by passing it on to Hydra as `++key=value`; or
  - unknown: refused, naming the key, a close match (difflib) and the valid keys beside it.

Usage in an entry point:

    @cli.entry("generate", fields=lambda: {"": GenerateConfig}, interrupted=lambda cfg: "...")
    def main(cfg: DictConfig) -> None:
        ...raise cli.UsageError("output_dir ... is a file")...   # -> `error: ...`, exit 2
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import sys
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from opsynth.config import close_match

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
USAGE_EXIT = 2  # a usage or configuration error (the shell convention, also argparse's)
INTERRUPT_EXIT = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command

# Loggers of libraries that print at INFO what no user of a command needs (matplotlib's
# "generated new fontManager", Dask's cluster start-up chatter); warnings and errors still show.
QUIET_LOGGERS = {"matplotlib": logging.WARNING, "PIL": logging.WARNING, "fsspec": logging.WARNING,
                 "httpx": logging.WARNING, "urllib3": logging.WARNING, "filelock": logging.WARNING,
                 "distributed": logging.ERROR, "tornado": logging.ERROR, "asyncio": logging.ERROR}


class UsageError(Exception):
    """A bad setting or input file, said in one line that names it and what would be valid."""


def fail(message: str, code: int = USAGE_EXIT) -> NoReturn:
    """Print `error: message` as one line on stderr and exit with `code`."""
    one_line = " ".join(str(message).split())
    print(f"error: {one_line}", file=sys.stderr, flush=True)
    sys.exit(code)


def quiet_libraries() -> None:
    """Raise the level of the chatty library loggers (call after Hydra set up logging)."""
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)


def logs_to_stderr() -> None:
    """Send log lines that Hydra's console handler writes to stdout to stderr instead: stdout is
    for a command's result (generate's JSON summary, evaluate's JSON), so `cmd > out.json` works."""
    for logger in (logging.getLogger(), *(lg for lg in logging.root.manager.loggerDict.values()
                                          if isinstance(lg, logging.Logger))):
        for h in logger.handlers:
            if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is sys.stdout:
                h.setStream(sys.stderr)


# --- what a command accepts -------------------------------------------------------------------

def dataclass_keys(cls: type, prefix: str = "") -> tuple[set[str], set[str]]:
    """(dotted keys of `cls`, nested dataclasses included; prefixes under which any key goes).

    A `dict`/`Mapping`/`Any` field (e.g. `cluster.slurm`) is open: every key under it is accepted,
    since the dataclass passes it on to a library that checks it."""
    keys, open_prefixes = set(), set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        keys.add(key)
        hint = hints.get(f.name)
        origin = typing.get_origin(hint) or hint
        if dataclasses.is_dataclass(hint):
            sub, sub_open = dataclass_keys(hint, key + ".")
            keys |= sub
            open_prefixes |= sub_open
        elif hint is Any or origin in (dict, Mapping, typing.Mapping) or (
                isinstance(origin, type) and issubclass(origin, Mapping)):
            open_prefixes.add(key)
    return keys, open_prefixes


Fields = Mapping[str, type] | Callable[[], Mapping[str, type]] | None


def schema_keys(fields: Fields) -> tuple[set[str], set[str]]:
    """The keys of each `prefix -> dataclass` entry of `fields` ("" for the top level). `fields`
    may be a function returning that mapping, called only when a key is missing from the YAML (so
    a command whose dataclasses import torch answers a plain mistake without importing it)."""
    keys, open_prefixes = set(), set()
    if callable(fields):
        fields = fields()
    for prefix, cls in (fields or {}).items():
        k, o = dataclass_keys(cls, f"{prefix}." if prefix else "")
        keys |= k
        open_prefixes |= o
        if prefix:
            keys.add(prefix)
    return keys, open_prefixes


def _accepts(key: str, keys: Collection[str], open_prefixes: Collection[str]) -> bool:
    return key in keys or any(key.startswith(p + ".") for p in open_prefixes)


def _config_keys(cfg: Any, prefix: str = "") -> set[str]:
    """Every dotted key of a composed config, inner nodes included."""
    from omegaconf import DictConfig

    out = set()
    if isinstance(cfg, DictConfig):
        for k in cfg:
            key = f"{prefix}{k}"
            out.add(key)
            out |= _config_keys(cfg._get_node(k), key + ".")
    return out


def unknown_key_message(key: str, known: Iterable[str], groups: Iterable[str] = (), limit: int = 24) -> str:
    """`unknown setting 'n_task' (did you mean 'n_tasks'?); settings: ...`, listing the keys beside it
    (at most `limit` of them) and, at the top level, the config groups."""
    known = sorted(set(known))
    parent = key.rpartition(".")[0]
    siblings = sorted(k for k in known if k.rpartition(".")[0] == parent)
    while parent and not siblings:  # `foo.bar` with no `foo`: suggest among the level that exists
        parent = parent.rpartition(".")[0]
        siblings = sorted(k for k in known if k.rpartition(".")[0] == parent)
    names = [k.rpartition(".")[2] for k in siblings]
    leaf = key[len(parent) + 1:] if parent else key
    guess = close_match(leaf.partition(".")[0], names)
    hint = f" (did you mean '{parent + '.' if parent else ''}{guess}'?)" if guess else ""
    where = f"{parent} settings" if parent else "settings"
    shown = ", ".join(names[:limit]) + (f", and {len(names) - limit} more" if len(names) > limit else "")
    groups = sorted(groups) if not parent else []
    group_part = f"; groups: {', '.join(g + '=' for g in groups)}" if groups else ""
    return f"unknown setting '{key}'{hint}; {where}: {shown}{group_part}"


# --- composing the overrides as Hydra will ----------------------------------------------------

def _compose(config_name: str, overrides: list[str], config_dir: Path):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=True)


def _group_options(config_dir: Path) -> dict[str, list[str]]:
    return {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in sorted(config_dir.iterdir()) if d.is_dir()}


def _missing_group_message(text: str, config_dir: Path) -> str:
    m = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
    if not m:
        return text.splitlines()[0]
    group, choice = m.group(1), m.group(2)
    options = _group_options(config_dir).get(group, [])
    guess = close_match(choice, options)
    hint = f" (did you mean {group}={guess}?)" if guess else ""
    return f"{group}={choice} is not an option{hint}; {group}= takes one of {', '.join(options)} (conf/{group}/*.yaml)"


def check_overrides(config_name: str, overrides: list[str], fields: Fields = None,
                    required: Mapping[str, str | None] | None = None, config_dir: Path = CONF_DIR) -> list[str]:
    """The overrides to hand to Hydra, after composing them as Hydra will; raises UsageError.

    fields: `prefix -> dataclass` that the command builds its settings from ("" for the top level);
        a key one of them has but the YAML lacks is passed on as `++key=value`.
    required: what to say for a `???` key left unset, e.g. {"repo_id": "add repo_id=<user or org>/<name>"};
        a key mapped to None is left to the command (needed by one mode only, say)."""
    return _checked_compose(config_name, overrides, fields, required, config_dir)[0]


def compose(config_name: str, overrides: list[str], fields: Fields = None, config_dir: Path = CONF_DIR):
    """The settings the command `config_name` would run with these overrides (a DictConfig without
    Hydra's own node), read as the command line reads them (`check_overrides`: a dataclass key the
    YAML lacks is accepted): for scripts that build a command's settings without running it."""
    return _checked_compose(config_name, overrides, fields, None, config_dir)[1]


def _checked_compose(config_name: str, overrides: list[str], fields: Fields,
                     required: Mapping[str, str | None] | None, config_dir: Path):
    """(the overrides as Hydra takes them, the composed settings without Hydra's node): `check_overrides`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException

    overrides = list(overrides)
    parser = OverridesParser.create()
    for line in overrides:
        try:
            parser.parse_override(line)
        except (OverrideParseException, HydraException):
            raise UsageError(f"cannot read the setting {line!r}: write key=value, e.g. n_tasks=5 "
                             "(quote values with spaces or commas)") from None
    schema: list[tuple[set[str], set[str]]] = []  # computed on first need

    def known() -> tuple[set[str], set[str]]:
        if not schema:
            schema.append(schema_keys(fields))
        return schema[0]

    for _ in range(len(overrides) + 1):
        try:
            cfg = _compose(config_name, overrides, config_dir)
            break
        except MissingConfigException as e:
            raise UsageError(_missing_group_message(str(e), config_dir)) from None
        except ConfigCompositionException as e:
            m = re.match(r"Could not override '([^']+)'", str(e))
            if not m:
                raise UsageError(" ".join(str(e).split("\n")[:2])) from None
            key = m.group(1)
            i = next((j for j, line in enumerate(overrides)
                      if parser.parse_override(line).key_or_group == key
                      and parser.parse_override(line).type == OverrideType.CHANGE), None)
            if i is not None and not key.startswith("hydra.") and _accepts(key, *known()):
                overrides[i] = "++" + overrides[i]
                continue
            raise UsageError(unknown_key_message(key, *_known_keys(config_name, overrides, key, known()[0],
                                                                   config_dir))) from None
        except HydraException as e:
            raise UsageError(" ".join(str(e).split())) from None
    else:  # every pass promoted one override; the last compose still failed
        raise UsageError(f"cannot compose the {config_name} config from {overrides}")
    from omegaconf import OmegaConf

    task_cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    hints = dict(required or {})
    missing = sorted(k for k in OmegaConf.missing_keys(task_cfg) if hints.get(k, "") is not None)
    if missing:
        k = missing[0]
        raise UsageError(f"{k} is required: {hints.get(k) or f'add {k}=<value>'}")
    return overrides, task_cfg


def _known_keys(config_name: str, overrides: list[str], bad_key: str, schema: set[str],
                config_dir: Path) -> tuple[set[str], list[str]]:
    """(the keys of the config composed without the offending override, and the dataclass's; the
    config groups it chose from). The schema alone when that does not compose either."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    rest = [o for o in overrides if parser.parse_override(o).key_or_group != bad_key]
    try:
        cfg = _compose(config_name, rest, config_dir)
        found = {k for k in _config_keys(cfg) if k != "hydra" and not k.startswith("hydra.")}
        groups = sorted(g for g in cfg.hydra.runtime.choices if not g.startswith("hydra/"))
    except Exception:
        found, groups = set(), []
    return found | schema, groups


# --- the entry decorator ----------------------------------------------------------------------

def apply_aliases(args: list[str], aliases: Mapping[str, str]) -> list[str]:
    """`policy=PATH` -> `score.policy=PATH` for each alias (also written `+policy=` / `++policy=`).

    Why: a key named like a config group of conf/ (`policy`, the train command's) is read by Hydra as
    that group whatever the command's YAML says, so a command that wants the plain value takes it
    under another key and accepts the short name here, before Hydra parses anything."""
    out = []
    for a in args:
        key, sep, value = a.lstrip("+").partition("=")
        out.append(f"{aliases[key]}={value}" if sep and key in aliases else a)
    return out


def entry(config_name: str, *, fields: Fields = None, required: Mapping[str, str | None] | None = None,
          usage_errors: tuple[type[BaseException], ...] = (), interrupted: Callable[[Any], str] | None = None,
          aliases: Mapping[str, str] | None = None,
          config_dir: Path = CONF_DIR) -> Callable[[Callable[[Any], Any]], Callable[..., Any]]:
    """`hydra.main(<config_dir>/<config_name>.yaml)` with the project's error contract.

    fields / required: see `check_overrides` (run on the command line before Hydra starts).
    aliases: short key -> the config's key (`apply_aliases`), e.g. {"policy": "score.policy"}.
    usage_errors: exception types the command raises for bad input (besides UsageError), turned
        into `error: <message>`, exit 2 (e.g. PushError).
    interrupted: `cfg -> one line` said on Ctrl-C (what was kept, how to resume); exit 130.
    Command lines with Hydra flags (`--cfg job`, `-m`, `--help`) go to Hydra unchecked."""
    import hydra

    def decorate(task: Callable[[Any], Any]) -> Callable[..., Any]:
        @functools.wraps(task)  # Hydra names the job (and its log file) after the wrapped function's module
        def guarded(cfg):
            logs_to_stderr()
            quiet_libraries()
            try:
                return task(cfg)
            except UsageError as e:
                fail(str(e))
            except usage_errors as e:  # type: ignore[misc]
                fail(str(e))
            except KeyboardInterrupt:
                line = "interrupted"
                if interrupted is not None:
                    try:
                        line = interrupted(cfg)
                    except Exception as e:  # the summary of what was kept must not hide the interrupt
                        line = f"interrupted ({type(e).__name__} while summing up what was kept)"
                print(line, file=sys.stderr, flush=True)
                sys.exit(INTERRUPT_EXIT)

        hydra_main = hydra.main(config_path=str(config_dir), config_name=config_name, version_base=None)(guarded)

        @functools.wraps(task)
        def main(cfg_passthrough: Any = None) -> Any:
            if cfg_passthrough is not None:
                return guarded(cfg_passthrough)
            args = apply_aliases(sys.argv[1:], aliases or {})
            sys.argv[1:] = args
            try:
                if not any(a.startswith("-") for a in args):
                    sys.argv[1:] = check_overrides(config_name, args, fields, required, config_dir)
                return hydra_main()
            except UsageError as e:
                fail(str(e))
            except KeyboardInterrupt:  # before the command started: nothing was written
                print("interrupted before the command started; nothing was written", file=sys.stderr)
                sys.exit(INTERRUPT_EXIT)

        main.config_name = config_name  # type: ignore[attr-defined]
        return main

    return decorate
