"""Verdicts on disk: ``check_rule``'s verdicts kept between processes, keyed by
``rule_key.verdict_key`` (the rule's content, the checker's version and torch's release line;
never its name, never hypothesis's version).

Two sources, read in this order by ``transforms.rewrite.verdicts``:

- the **shipped** verdicts (``SHIPPED``, ``transforms/rewrite/shipped_verdicts.json``): the
  shipped rules' verdicts, one section per torch release line they were computed on (each
  written by ``python -m transforms.rewrite.verdicts --write`` under that torch, which keeps
  the other lines' sections of the same checker), read without running a check; a test
  recomputes a sample and fails when they drift;
- a **store**: a directory of one JSON file per verdict, ``<dir>/<key>.json``. By default
  ``$XDG_CACHE_HOME/purefx/verdicts`` (``~/.cache/purefx/verdicts`` without it); the
  environment variable ``PUREFX_VERDICTS`` moves it (a directory) or turns it off (``off``,
  ``0``, ``none`` or empty: ``VERDICTS_OFF``); so does the ``verdicts=`` argument of ``rewrite``,
  ``ensure_checked`` and ``check_rules`` (a directory, or ``False`` for none), which wins
  over the variable. The directory, its variable and the checksum are ``ir.fact_store``'s
  (re-exported here), which keeps the observed facts of operators outside the verified table
  in the same store's ``operators/`` subdirectory.

A verdict is a claim about soundness, so an entry is trusted only when it is well formed JSON
of this format, names the key it is filed under and the versions of this process, and carries a
checksum (sha256 of its body) that matches; anything else (a truncated file, a foreign or
edited entry, an entry of another checker) is ignored, the rule checked again and the entry
written anew. Writes are atomic (a temporary file in the directory, then ``os.replace``), so a
reader sees a whole entry or none. Nothing is pickled: an entry holds the verdict (``right``
or ``wrong``), the counts ``check_rule`` returned, and for a wrong rule the counterexample's
text.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ir.fact_store import ENV, VERDICTS_OFF, checksum, default_directory, env_directory

FORMAT = 2
"""The entries' format; an entry of another format is ignored (format 1 also recorded
hypothesis's version)."""
SHIPPED = Path(__file__).with_name("shipped_verdicts.json")
"""The shipped rules' verdicts, with the package."""


@attrs.frozen
class Stored:
    """One verdict as the store keeps it: ``right``; ``detail``, for a wrong rule what the
    ``LawViolation`` said (its counterexample, without the rule's name); ``ran``,
    ``rewritten``, ``restrided``: what ``check_rule`` returned for a right one; ``rule``: the
    name it was checked under (for a reader of the file only; never compared);
    ``excused_by``, for a wrong rule the assumptions that would make it right
    (``transforms.rewrite.refusal``: ``()`` none, ``None`` not known: an entry written
    before refusals named them)."""

    right: bool
    detail: str = ""
    ran: int = 0
    rewritten: int = 0
    restrided: tuple[str, ...] = ()
    rule: str = ""
    excused_by: tuple[str, ...] | None = None

    def body(self, key: str, versions: tuple[str, str]) -> dict[str, Any]:
        """The JSON object filed under ``key`` (checksum included); ``versions`` as
        ``rule_key.versions()`` gives them."""
        checker, torch_version = versions
        body = {"format": FORMAT, "key": key, "checker": checker, "torch": torch_version,
                "verdict": "right" if self.right else "wrong",
                "detail": self.detail, "ran": self.ran, "rewritten": self.rewritten,
                "restrided": list(self.restrided), "rule": self.rule}
        if self.excused_by is not None:
            body["excused_by"] = sorted(self.excused_by)
        body["sum"] = checksum(body)
        return body


def parse(body: Any, key: str, versions: tuple[str, str]) -> Stored | None:
    """The verdict ``body`` (a parsed JSON value) holds for ``key`` under ``versions``, or
    ``None`` when it is not one to trust: another shape or format, another key or version, a
    checksum that does not match. Never raises. O(size of body)."""
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        return None
    checker, torch_version = versions
    if (body.get("key"), body.get("checker"), body.get("torch")) != (key, checker, torch_version):
        return None
    if body.get("sum") != checksum(body) or body.get("verdict") not in ("right", "wrong"):
        return None
    detail, ran, rewritten = body.get("detail"), body.get("ran"), body.get("rewritten")
    restrided, rule = body.get("restrided"), body.get("rule")
    if not (isinstance(detail, str) and type(ran) is int and type(rewritten) is int
            and isinstance(restrided, list) and all(isinstance(r, str) for r in restrided)
            and isinstance(rule, str)):
        return None
    right = body["verdict"] == "right"
    if right and (rewritten < 1 or ran < rewritten):
        return None  # a right verdict checked something
    if not right and not detail:
        return None
    excused = body.get("excused_by")
    if excused is not None and not (isinstance(excused, list)
                                    and all(isinstance(f, str) for f in excused)):
        return None
    return Stored(right, detail, ran, rewritten, tuple(restrided), rule,
                  None if excused is None else tuple(excused))


@attrs.frozen
class VerdictStore:
    """A directory of verdicts, one JSON file per key (``<directory>/<key>.json``)."""

    directory: Path = attrs.field(converter=Path)

    def get(self, key: str, versions: tuple[str, str]) -> Stored | None:
        """The verdict filed under ``key``, or ``None`` when there is none to trust (missing,
        unreadable, corrupt, foreign: ``parse``). Never raises. O(entry size)."""
        if not _is_key(key):
            return None
        try:
            text = (self.directory / f"{key}.json").read_text(encoding="utf-8")
            body = json.loads(text)
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        return parse(body, key, versions)

    def put(self, key: str, versions: tuple[str, str], verdict: Stored) -> bool:
        """File ``verdict`` under ``key``, atomically (a temporary file in the directory, then
        ``os.replace``; the directory made when missing). Returns whether it was written: a
        store that cannot be written (read-only, full) keeps nothing and raises nothing, as a
        cache may. O(entry size)."""
        if not _is_key(key):
            return False
        tmp = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(verdict.body(key, versions), f, sort_keys=True, indent=1)
            os.replace(tmp, self.directory / f"{key}.json")
            return True
        except OSError:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            return False


def _is_key(key: str) -> bool:
    return len(key) == 64 and all(c in "0123456789abcdef" for c in key)


def store_for(verdicts: Any = None) -> VerdictStore | None:
    """The store a call uses: ``verdicts`` when given (a directory as ``str`` or
    ``os.PathLike``; ``False`` for none; a ``VerdictStore`` as it is), else ``PUREFX_VERDICTS``
    (a directory, or one of ``VERDICTS_OFF`` for none), else ``default_directory()``. Raises
    ``TypeError`` for another kind of ``verdicts``. O(1)."""
    if isinstance(verdicts, VerdictStore):
        return verdicts
    if verdicts is False:
        return None
    if isinstance(verdicts, (str, os.PathLike)):
        return VerdictStore(Path(verdicts))
    if verdicts is not None and verdicts is not True:
        raise TypeError(
            f"verdicts must be a directory (str or path), False for no store, or None for the "
            f"default (${ENV}, else the user's cache directory); got {type(verdicts).__name__}"
        )
    found = env_directory()
    return None if found is None else VerdictStore(found)


@functools.cache
def shipped_sections(path: Path = SHIPPED) -> Mapping[str, Mapping[str, Any]]:
    """The sections of the shipped verdicts file at ``path`` (read once per process and path):
    torch line -> ``{"checker", "computed_on", "entries"}``; empty when the file is missing,
    not JSON or of another format. Never raises. Do not change what it returns."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return {}
    torches = data.get("torch")
    if not isinstance(torches, dict):
        return {}
    return {line: section for line, section in torches.items()
            if isinstance(section, dict) and isinstance(section.get("entries"), dict)}


def shipped_lines(checker: str, path: Path = SHIPPED) -> tuple[str, ...]:
    """The torch lines whose verdicts ship (a section at ``path``) for checker version
    ``checker``, sorted. O(sections)."""
    return tuple(sorted(line for line, section in shipped_sections(path).items()
                        if section.get("checker") == checker))


def shipped(key: str, versions: tuple[str, str]) -> Stored | None:
    """The shipped verdict for ``key`` under ``versions`` (its torch line's section of
    ``SHIPPED``), or ``None`` (none, or not one to trust: ``parse``). Never raises."""
    section = shipped_sections().get(versions[1], {})
    return parse(section.get("entries", {}).get(key), key, versions)


def write_shipped(entries: Mapping[str, Stored], versions: tuple[str, str],
                  computed_on: Mapping[str, str], path: Path = SHIPPED) -> tuple[str, ...]:
    """Make ``entries`` (key -> verdict) the section of torch line ``versions[1]`` of the
    shipped verdicts file at ``path``, keys sorted, atomically; ``computed_on`` (the exact
    versions they were checked under: torch, hypothesis, python) is recorded beside them. The
    other lines' sections of the same checker are kept; those of another checker (which no key
    of this one can reach) are dropped, and their lines returned, so the caller can say which
    torches to regenerate on. O(entries in the file)."""
    checker, line = versions
    kept, dropped = {}, []
    for other, section in shipped_sections(path).items():
        if other == line:
            continue
        if section.get("checker") == checker:
            kept[other] = section
        else:
            dropped.append(other)
    kept[line] = {"checker": checker, "computed_on": dict(computed_on),
                  "entries": {k: entries[k].body(k, versions) for k in sorted(entries)}}
    data = {"format": FORMAT, "torch": {k: kept[k] for k in sorted(kept)}}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    shipped_sections.cache_clear()
    return tuple(sorted(dropped))


__all__ = [
    "ENV",
    "FORMAT",
    "SHIPPED",
    "VERDICTS_OFF",
    "Stored",
    "VerdictStore",
    "checksum",
    "default_directory",
    "parse",
    "shipped",
    "shipped_lines",
    "shipped_sections",
    "store_for",
    "write_shipped",
]
