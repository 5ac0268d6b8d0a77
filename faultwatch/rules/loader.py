"""Reads rule files (YAML, with line marks) and validates each (rules/merging.py merges them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from faultwatch.core.events import ACTIONS, CATEGORIES
from faultwatch.core.names import did_you_mean
from faultwatch.errors import RuleProblem
from faultwatch.rules import validate as v
from faultwatch.rules.model import DEFAULT_PRIORITY, KINDS, POLICY_KEYS, Rule, RuleTest
from faultwatch.rules.patterns import fast_engine_errors

BUILTIN_DIR = Path(__file__).parent / "builtin"
TOP_KEYS = ("version", "rules", "policy", "exceptions")
RULE_KEYS = ("id", "kind", "category", "contains", "regex", "exit_codes", "signals", "stream",
             "action", "cascade", "description", "tests", "disabled", "ignore_case", "priority",
             "stage", "opens", "hang_window_s", "override", "source")
OVERRIDES = ("merge", "replace")  # how a rule overrides an earlier rule with its id
PATTERN_KEYS = ("contains", "regex", "exit_codes", "signals")  # merged as unions
TEST_KEYS = ("match", "no_match")
TEST_ITEM_KEYS = ("line", "step", "total")


def builtin_paths() -> list[Path]:
    """The built-in rule files, sorted."""
    return sorted(BUILTIN_DIR.glob("*.yaml"))


@dataclass
class FileResult:
    """What one file contributes: rules, disabled ids, policy entries and problems."""

    path: str
    rules: list[Rule] = field(default_factory=list)
    disabled: list[tuple[str, int]] = field(default_factory=list)
    policy: dict[str, object] = field(default_factory=dict)
    exceptions: dict[str, str] = field(default_factory=dict)
    problems: list[RuleProblem] = field(default_factory=list)
    layer: str = ""  # the layer the file belongs to (rules/layers.py): builtin, files, pushed


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def suggest(key: str, allowed: Iterable[str]) -> str:
    return did_you_mean(key, allowed, n=1)


class _BadValue:
    """A value YAML could not construct (already reported); equal to nothing."""

    def __repr__(self) -> str:
        return "<invalid value>"


BAD_VALUE = _BadValue()


# libyaml's parser where PyYAML was built with it (its wheels are): ~10x faster than the
# pure-Python one, same nodes and marks; a file it refuses is parsed again by the pure-Python
# one, so that syntax errors read the same everywhere
FAST_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def shape_problem(text: str) -> tuple[int, str] | None:
    """(line, message) when the YAML is too deep or its aliases expand too far, found by
    one pass over the parser's events (no recursion, no expansion), else None."""
    try:
        return _shape_problem(text, FAST_LOADER)
    except yaml.YAMLError:
        if FAST_LOADER is yaml.SafeLoader:
            return None
    try:  # (libyaml reads ahead and refuses some shapes before it yields their events)
        return _shape_problem(text, yaml.SafeLoader)
    except yaml.YAMLError:
        return None  # syntax errors are reported with their mark by the composer


def _shape_problem(text: str, loader: type[yaml.SafeLoader]) -> tuple[int, str] | None:
    depth = 0
    events = 0
    expanded = 0
    sizes: dict[str, int] = {}
    open_anchors: list[tuple[str | None, int]] = []
    for ev in yaml.parse(text, Loader=loader):
        events += 1
        line = ev.start_mark.line + 1 if ev.start_mark else 1
        if isinstance(ev, yaml.CollectionStartEvent):
            depth += 1
            if depth > v.MAX_YAML_DEPTH:
                return line, f"nesting deeper than {v.MAX_YAML_DEPTH} levels"
            open_anchors.append((ev.anchor, expanded + events))
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1
            anchor, start = open_anchors.pop()
            if anchor is not None:
                sizes[anchor] = expanded + events - start + 1
        elif isinstance(ev, yaml.AliasEvent):
            expanded += sizes.get(ev.anchor or "", 1)
        elif isinstance(ev, yaml.ScalarEvent) and ev.anchor is not None:
            sizes[ev.anchor] = 1
        if expanded + events > v.MAX_YAML_NODES:
            return line, (f"the document expands to more than {v.MAX_YAML_NODES} nodes "
                          "(anchors and aliases)")
    return None


class _FileParser:
    def __init__(self, path: str, text: str):
        self.res = FileResult(path)
        self.text = text
        self.loader = FAST_LOADER(text)
        # regexes that passed the other checks, for the linear-time engine's (one compile)
        self.fast_pending: list[tuple[str, bool, yaml.Node, str | None]] = []

    def problem(self, node: yaml.Node | int, message: str, rule_id: str | None = None) -> None:
        line = node if isinstance(node, int) else _line(node)
        self.res.problems.append(RuleProblem(self.res.path, line, message, rule_id))

    def scalar(self, node: yaml.Node) -> Any:
        """The node's value; BAD_VALUE (and a problem) when YAML cannot construct it: an
        impossible date, a python/* tag, anything SafeLoader refuses."""
        try:
            return self.loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as e:
            what = e.problem if isinstance(e, yaml.MarkedYAMLError) and e.problem else str(e)
            self.problem(node, f"invalid value: {what.splitlines()[0][:200]}")
            return BAD_VALUE

    def mapping(self, node: yaml.Node, what: str, allowed: Sequence[str],
                rule_id: str | None = None) -> dict[str, tuple[yaml.Node, yaml.Node]] | None:
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, f"{what} must be a mapping", rule_id)
            return None
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for knode, vnode in node.value:
            key = knode.value if isinstance(knode, yaml.ScalarNode) else None
            if not isinstance(key, str):
                self.problem(knode, f"{what}: keys must be strings", rule_id)
            elif key in out:
                self.problem(knode, f"{what}: duplicate key {key!r}", rule_id)
            elif key not in allowed:
                self.problem(knode, f"{what}: unknown key {key!r}{suggest(key, allowed)}",
                             rule_id)
            else:
                out[key] = (knode, vnode)
        return out

    def parse(self) -> FileResult:
        shape = shape_problem(self.text)
        if shape is not None:
            self.problem(*shape)
            self.loader.dispose()
            return self.res
        try:
            try:
                root = self.loader.get_single_node()
            except yaml.YAMLError:
                if FAST_LOADER is yaml.SafeLoader:
                    raise
                self.loader.dispose()  # the pure-Python parser's words for what is wrong
                self.loader = yaml.SafeLoader(self.text)
                root = self.loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            line = mark.line + 1 if mark else 1
            self.problem(line, f"invalid YAML: {e.problem or e}")
            return self.res
        except (yaml.YAMLError, RecursionError) as e:
            self.problem(1, f"invalid YAML: {str(e).splitlines()[0][:200]}")
            return self.res
        finally:
            self.loader.dispose()
        if root is None:
            self.problem(1, "empty rule file")
            return self.res
        top = self.mapping(root, "rule file", TOP_KEYS)
        if top is None:
            return self.res
        if "version" in top:
            vnode = top["version"][1]
            version = self.scalar(vnode)
            if version is not BAD_VALUE and version != 1:
                self.problem(vnode, "version must be 1")
        else:
            self.problem(root, "missing key 'version' (use version: 1)")
        if "policy" in top:
            self.parse_policy(top["policy"][1])
        if "rules" in top:
            self.parse_rules(top["rules"][1])
        if "exceptions" in top:
            self.parse_exceptions(top["exceptions"][1])
        pending = self.fast_pending
        errs = fast_engine_errors([(pat, ic) for pat, ic, _, _ in pending])
        for (_, _, node, rid), err in zip(pending, errs, strict=True):
            if err:
                self.problem(node, err, rid)
        return self.res

    def parse_exceptions(self, node: yaml.Node) -> None:
        """`exceptions: {ClassName: category}`: the final exception of a traceback with no
        more specific rule maps to that category (rule id `exception.ClassName`)."""
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, "exceptions must be a mapping of exception class -> category")
            return
        if len(node.value) > v.MAX_RULES_PER_FILE:
            self.problem(node, f"{len(node.value)} exception classes in one file, the limit "
                         f"is {v.MAX_RULES_PER_FILE}")
            return
        for knode, vnode in node.value:
            name = knode.value if isinstance(knode, yaml.ScalarNode) else None
            if not isinstance(name, str) or not v.EXC_NAME_RE.match(name):
                self.problem(knode, f"exceptions: {name!r} is not an exception class name "
                             "(like ConnectionResetError or socket.timeout)")
                continue
            if name in self.res.exceptions:
                self.problem(knode, f"exceptions: duplicate class {name!r}")
                continue
            cat = self.scalar(vnode)
            if cat is BAD_VALUE:
                continue
            if cat not in CATEGORIES or cat == "unknown":
                self.problem(vnode, f"exceptions.{name}: category must be one of "
                             f"{', '.join(c for c in CATEGORIES if c != 'unknown')}")
                continue
            self.res.exceptions[name] = cat

    def parse_policy(self, node: yaml.Node) -> None:
        items = self.mapping(node, "policy", tuple(POLICY_KEYS))
        for key, (_knode, vnode) in (items or {}).items():
            value = self.scalar(vnode)
            if value is BAD_VALUE:
                continue
            err = v.policy_value_error(key, value)
            if err:
                self.problem(vnode, err)
                continue
            if POLICY_KEYS[key] is float:
                value = float(value)
            elif POLICY_KEYS[key] is str:
                value = value.lower()
            self.res.policy[key] = value

    def parse_rules(self, node: yaml.Node) -> None:
        if not isinstance(node, yaml.SequenceNode):
            self.problem(node, "rules must be a list")
            return
        if len(node.value) > v.MAX_RULES_PER_FILE:
            self.problem(node, f"{len(node.value)} rules in one file, the limit is "
                         f"{v.MAX_RULES_PER_FILE}")
            return
        seen: dict[str, int] = {}
        for rnode in node.value:
            rid = self.parse_rule(rnode)
            if rid is None:
                continue
            if rid in seen:
                self.problem(rnode, f"duplicate rule id {rid!r} (first at line {seen[rid]})", rid)
            else:
                seen[rid] = _line(rnode)

    def strings(self, node: yaml.Node, key: str, rid: str | None) -> tuple[str, ...] | None:
        value = self.scalar(node)
        if value is BAD_VALUE:
            return None
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
            self.problem(node, f"{key} must be a non-empty string or a list of them", rid)
            return None
        return tuple(value)

    def parse_rule(self, rnode: yaml.Node) -> str | None:
        n0 = len(self.res.problems)
        m = self.mapping(rnode, "rule", RULE_KEYS)
        if m is None:
            return None
        rid: str | None = None
        if "id" not in m:
            self.problem(rnode, "rule: missing required key 'id'")
        else:
            value = self.scalar(m["id"][1])
            if not isinstance(value, str) or not v.ID_RE.match(value):
                self.problem(m["id"][1], f"rule id {value!r} must match [a-z0-9][a-z0-9_.-]*")
            else:
                rid = value
        # problems found before the id was known get the id now
        self.res.problems[n0:] = [RuleProblem(p.path, p.line, p.message, p.rule_id or rid)
                                  for p in self.res.problems[n0:]]

        def get(key: str, typ: type | tuple[type, ...], what: str) -> Any:
            if key not in m:
                return None
            val = self.scalar(m[key][1])
            if val is BAD_VALUE:
                return None
            ok = isinstance(val, typ) and not (isinstance(val, bool) and typ in (int, (int, float)))
            if val is not None and not ok:
                self.problem(m[key][1], f"{key} must be {what}", rid)
                return None
            return val

        disabled = get("disabled", bool, "true or false")
        if disabled:
            if rid is not None:
                self.res.disabled.append((rid, _line(rnode)))
            return rid
        override = get("override", str, "merge or replace")
        if override is not None and override not in OVERRIDES:
            self.problem(m["override"][1], f"override must be merge or replace"
                         f"{suggest(override, OVERRIDES)}", rid)
            override = None
        merging = override == "merge"  # keys not given come from the earlier rule
        kind = get("kind", str, "one of " + ", ".join(KINDS)) or "error"
        if kind not in KINDS:
            self.problem(m["kind"][1], f"kind must be one of {', '.join(KINDS)}", rid)
            return rid
        fields: dict[str, Any] = {"kind": kind}
        category = get("category", str, "a string")
        if kind == "error" and not (merging and "category" not in m):
            if category is None and "category" not in m:
                self.problem(rnode, "rule: missing required key 'category'", rid)
            elif category not in CATEGORIES:
                self.problem(m["category"][1], f"category must be one of "
                             f"{', '.join(CATEGORIES)}", rid)
            fields["category"] = category
        elif "category" in m:
            self.problem(m["category"][0], f"category is only for kind: error (not {kind})", rid)
        for key in ("contains", "regex"):
            if key in m:
                vals = self.strings(m[key][1], key, rid)
                if vals is not None:
                    fields[key] = vals
        for pat in fields.get("regex", ()):
            err = v.compile_error(pat) or v.backtracking_error(pat) or v.repeat_cost_error(pat)
            if err:
                self.problem(m["regex"][1], err, rid)
            else:  # the linear-time engine's check: one compile per file (parse())
                self.fast_pending.append((pat, "ignore_case" in m and self.scalar(
                    m["ignore_case"][1]) is True, m["regex"][1], rid))
        for pat in fields.get("contains", ()):
            if len(pat) > v.MAX_PATTERN_LEN:
                self.problem(m["contains"][1], f"contains string longer than "
                             f"{v.MAX_PATTERN_LEN} characters", rid)
        if "exit_codes" in m:
            codes = self.scalar(m["exit_codes"][1])
            codes = [codes] if isinstance(codes, int) and not isinstance(codes, bool) else codes
            if not isinstance(codes, list) or not all(
                    isinstance(c, int) and not isinstance(c, bool) and -255 <= c <= 255
                    for c in codes):
                self.problem(m["exit_codes"][1], "exit_codes must be a list of integers "
                             "in -255..255", rid)
            else:
                fields["exit_codes"] = tuple(codes)
        if "signals" in m:
            sigs = self.scalar(m["signals"][1])
            sigs = sigs if isinstance(sigs, list) else [sigs]
            nums = [v.signal_number(s) for s in sigs]
            bad = [s for s, n in zip(sigs, nums, strict=True) if n is None]
            if bad:
                self.problem(m["signals"][1], f"unknown signal(s) {bad}; use names like "
                             "SIGKILL or numbers 1..127", rid)
            else:
                fields["signals"] = tuple(n for n in nums if n is not None)
        stream = get("stream", str, "stdout or stderr")
        if stream is not None and stream not in ("stdout", "stderr"):
            self.problem(m["stream"][1], "stream must be stdout or stderr", rid)
        fields["stream"] = stream
        action = get("action", str, "a string")
        if action is not None and action not in ACTIONS:
            self.problem(m["action"][1], f"action must be one of {', '.join(ACTIONS)}", rid)
        fields["action"] = action
        fields["cascade"] = bool(get("cascade", bool, "true or false"))
        fields["ignore_case"] = bool(get("ignore_case", bool, "true or false"))
        prio = get("priority", int, "an integer")
        fields["priority"] = DEFAULT_PRIORITY if prio is None else prio
        fields["description"] = get("description", str, "a string") or ""
        if "source" in m:  # where the rule's texts and verdict come from (documentation only)
            src = m["source"][1]
            val = src.value if isinstance(src, yaml.ScalarNode) else None
            if isinstance(src, yaml.SequenceNode) and src.value and all(
                    isinstance(x, yaml.ScalarNode) and x.value.strip() for x in src.value):
                fields["source"] = tuple(x.value for x in src.value)
            elif isinstance(val, str) and val.strip():
                fields["source"] = (val,)
            else:
                self.problem(src, "source must be a non-empty string or list of strings", rid)
        has_lines = bool(fields.get("contains") or fields.get("regex"))
        if kind == "error" and not merging:
            if not (has_lines or fields.get("exit_codes") or fields.get("signals")):
                self.problem(rnode, "rule needs at least one of contains, regex, exit_codes, "
                             "signals", rid)
        else:
            for key in ("exit_codes", "signals", "action", "cascade"):
                if key in m:
                    self.problem(m[key][0], f"{key} is only for kind: error", rid)
        if kind == "progress":
            if "contains" in m or not (fields.get("regex") or merging):
                self.problem(rnode, "a progress rule needs regex (with a named group 'step'), "
                             "not contains", rid)
            for pat in fields.get("regex", ()):
                if v.compile_error(pat) is None and "step" not in v.named_groups(pat):
                    self.problem(m["regex"][1], f"progress regex {pat!r} has no named group "
                                 "(?P<step>...)", rid)
        if kind == "stage":
            stage = get("stage", str, "a stage name")
            if not stage and not merging:
                self.problem(rnode, "a stage rule needs key 'stage' (its name)", rid)
            fields["stage"] = stage
            fields["opens"] = get("opens", bool, "true or false") is not False
            hw = get("hang_window_s", (int, float), "a number of seconds or null")
            if hw is not None and hw <= 0:
                self.problem(m["hang_window_s"][1], "hang_window_s must be > 0", rid)
            fields["hang_window_s"] = None if hw is None else float(hw)
            if not has_lines and not merging:
                self.problem(rnode, "a stage rule needs contains or regex", rid)
        else:
            for key in ("stage", "opens", "hang_window_s"):
                if key in m:
                    self.problem(m[key][0], f"{key} is only for kind: stage", rid)
        if "tests" in m:
            fields["tests"] = self.parse_tests(m["tests"][1], kind, rid)
        if rid is not None and len(self.res.problems) == n0:
            self.res.rules.append(Rule(id=rid, path=self.res.path, line=_line(rnode),
                                       override=override,
                                       given=frozenset(k for k in m if k != "override"),
                                       **fields))
        return rid

    def parse_tests(self, node: yaml.Node, kind: str, rid: str | None) -> tuple[RuleTest, ...]:
        m = self.mapping(node, "tests", TEST_KEYS, rid)
        out: list[RuleTest] = []
        for key, (_knode, vnode) in (m or {}).items():
            if not isinstance(vnode, yaml.SequenceNode):
                self.problem(vnode, f"tests.{key} must be a list", rid)
                continue
            for item in vnode.value:
                if isinstance(item, yaml.ScalarNode):
                    text = self.scalar(item)
                    if not isinstance(text, str):
                        self.problem(item, "a test line must be a string", rid)
                        continue
                    out.append(RuleTest(text, key == "match", _line(item)))
                    continue
                im = self.mapping(item, "test", TEST_ITEM_KEYS, rid)
                if im is None:
                    continue
                if "line" not in im or not isinstance(self.scalar(im["line"][1]), str):
                    self.problem(item, "a test needs 'line' (a string)", rid)
                    continue
                nums: dict[str, int | None] = {"step": None, "total": None}
                for nk in nums:
                    if nk in im:
                        val = self.scalar(im[nk][1])
                        allowed = kind == "progress" or (kind == "stage" and nk == "step")
                        if not allowed or not isinstance(val, int):
                            self.problem(im[nk][1], f"{nk} is an integer, only for progress "
                                         "rules" + (" and stage rules (a checkpoint's step)"
                                                    if nk == "step" else ""), rid)
                        else:
                            nums[nk] = val
                out.append(RuleTest(self.scalar(im["line"][1]), key == "match", _line(item),
                                    nums["step"], nums["total"]))
        return tuple(out)


def read_rule_file(path: str | Path) -> tuple[str | None, RuleProblem | None]:
    """(text, None) of a rule file, or (None, the problem) when it is too big or unreadable."""
    name = str(path)
    try:
        size = Path(path).stat().st_size
        if size > v.MAX_FILE_BYTES:
            return None, RuleProblem(name, 1, f"file is {size} bytes, the limit is "
                                              f"{v.MAX_FILE_BYTES}")
        return Path(path).read_text(encoding="utf-8"), None
    except (OSError, UnicodeDecodeError) as e:
        return None, RuleProblem(name, 1, f"cannot read rule file: {e}")


def parse_file(path: str | Path, layer: str = "") -> FileResult:
    """Parses and validates one rule file; problems are collected, never raised."""
    text, problem = read_rule_file(path)
    if text is None:
        return FileResult(str(path), problems=[problem] if problem else [], layer=layer)
    return parse_text(str(path), text, layer)


def parse_text(name: str, text: str, layer: str = "") -> FileResult:
    """Parses and validates rule-file text that came from elsewhere (e.g. a pushed rule set);
    problems name `name` as the path."""
    size = len(text.encode("utf-8", "replace"))
    if size > v.MAX_FILE_BYTES:
        return FileResult(name, problems=[RuleProblem(
            name, 1, f"file is {size} bytes, the limit is {v.MAX_FILE_BYTES}")], layer=layer)
    res = _FileParser(name, text).parse()
    res.layer = layer
    return res


_BUILTIN_CACHE: dict[tuple[str, int, int], FileResult] = {}


def builtin_results() -> list[FileResult]:
    """The built-in files parsed (layer "builtin"), once per process and file version:
    parsing them validates ~400 patterns in the linear-time engines (seconds)."""
    out = []
    for p in builtin_paths():
        st = p.stat()
        key = (str(p), st.st_mtime_ns, st.st_size)
        if key not in _BUILTIN_CACHE:
            _BUILTIN_CACHE[key] = parse_file(p, "builtin")
        out.append(_BUILTIN_CACHE[key])
    return out
