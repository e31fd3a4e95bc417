"""Labels and selectors: Gazette's naming rules, selector syntax and matching semantics."""

from __future__ import annotations

import pickle
from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog import labels as L
from oncelog.labels import (
    CONTENT_TYPE,
    CONTENT_TYPE_JSON_LINES,
    LabelSelector,
    LabelSet,
    SelectorError,
    check_single_value_labels,
    journal_labels,
    parse_selector,
    validate_label_name,
    validate_label_value,
)

# -- LabelSet ------------------------------------------------------------------------------


def test_labelset_from_dict_sorts_and_dedupes_values():
    ls = LabelSet({"tier": ["web", "api", "web"], "app": "shop"})
    assert ls.names() == ["app", "tier"]
    assert ls.values("tier") == ["api", "web"]
    assert ls.value("app") == "shop"
    assert list(ls) == [("app", "shop"), ("tier", "api"), ("tier", "web")]
    assert len(ls) == 3


def test_labelset_from_pairs_and_from_labelset_are_equal():
    pairs = [("tier", "web"), ("app", "shop"), ("tier", "api"), ("tier", "api")]
    a = LabelSet(pairs)
    b = LabelSet({"app": "shop", "tier": ["web", "api"]})
    assert a == b
    assert hash(a) == hash(b)
    assert LabelSet(a) == a
    assert LabelSet() == LabelSet(None) == LabelSet({})
    assert not LabelSet() and bool(a)


def test_to_dict_is_json_friendly_and_round_trips():
    ls = LabelSet({"one": "1", "many": ["b", "a"], "empty": ""})
    assert ls.to_dict() == {"empty": "", "many": ["a", "b"], "one": "1"}
    assert LabelSet.from_value(ls.to_dict()) == ls


def test_from_value_returns_the_same_labelset_and_coerces_others():
    ls = LabelSet({"app": "shop"})
    assert LabelSet.from_value(ls) is ls
    assert LabelSet.from_value({"app": "shop"}) == ls
    assert LabelSet.from_value(None) == LabelSet()
    assert LabelSet.from_value([("app", "shop")]) == ls


def test_labelset_compares_equal_to_an_equivalent_dict():
    ls = LabelSet({"app": "shop", "tier": ["a", "b"]})
    assert ls == {"tier": ["b", "a"], "app": "shop"}
    assert ls != {"app": "shop"}
    assert ls != {"x": object()}  # not coercible: unequal, not an error


def test_value_of_a_multi_valued_label_is_an_error_naming_it():
    ls = LabelSet({"tier": ["a", "b"]})
    with pytest.raises(ValueError, match=r"label 'tier' has 2 values \['a', 'b'\], expected one"):
        ls.value("tier")
    assert ls.value("absent") is None
    assert ls.value("absent", "dflt") == "dflt"


def test_contains_names_and_pairs():
    ls = LabelSet({"app": "shop"})
    assert "app" in ls and "other" not in ls
    assert ("app", "shop") in ls and ("app", "web") not in ls


def test_derived_sets_leave_the_original_unchanged():
    base = LabelSet({"app": "shop", "tier": "web"})
    added = base.add("tier", "api")
    assert added.values("tier") == ["api", "web"]
    assert base.values("tier") == ["web"]
    assert base.set("tier", ["x", "y"]).values("tier") == ["x", "y"]
    assert base.set("tier", "x").values("tier") == ["x"]
    assert base.remove("tier") == {"app": "shop"}
    assert base.remove("absent") is base
    assert base.add("new", "v").names() == ["app", "new", "tier"]
    with pytest.raises(ValueError, match="invalid label name 'x'"):
        base.add("x", "v")
    with pytest.raises(ValueError, match="needs at least one value"):
        base.set("tier", [])


def test_merged_prefers_the_other_sets_values():
    left = LabelSet({"bbb": ["v1", "v2"], "ccc": "v3"})
    right = {"aaa": ["v4", "v5"], "bbb": "v6", "ddd": "v7"}
    assert left.merged(right).to_dict() == {
        "aaa": ["v4", "v5"],
        "bbb": "v6",
        "ccc": "v3",
        "ddd": "v7",
    }
    assert left.merged({}) is left


def test_labelset_pickles():
    ls = LabelSet({"app": "shop", "tier": ["a", "b"]})
    assert pickle.loads(pickle.dumps(ls)) == ls


@pytest.mark.parametrize(
    "labels, message",
    [
        ({"a": "v"}, r"invalid label name 'a': length 1 byte, expected 2 to 64"),
        ({"n" * 65: "v"}, r"invalid label name 'n{65}': length 65 bytes"),
        ({"é" * 33: "v"}, r"length 66 bytes"),  # lengths count UTF-8 bytes, as in Go
        ({"a label": "v"}, r"invalid label name 'a label': character ' ' is not allowed"),
        ({"a|label": "v"}, r"invalid label name 'a\|label': character '\|'"),
        ({"a=b": "v"}, r"invalid label name 'a=b': character '='"),
        ({"name:prefix": "v"}, r"':prefix' is only valid in a LabelSelector"),
        ({"a-label": "a|value"}, r"invalid label value 'a\|value' of label 'a-label'"),
        ({"a-label": "a value"}, r"character ' ' is not allowed"),
        ({"a-label": "v" * 1025}, r"length 1025 bytes, expected at most 1024"),
        ({"a-label": ["", "x"]}, r"label 'a-label' has the empty value and other values"),
        ({"a-label": []}, r"label 'a-label' has an empty list of values"),
    ],
)
def test_invalid_labels_are_rejected_with_the_bad_text(labels, message):
    with pytest.raises(ValueError, match=message):
        LabelSet(labels)


@pytest.mark.parametrize(
    "labels, message",
    [
        ({"a-label": 5}, r"values of label 'a-label' must be a str or a list of str, not int"),
        ({"a-label": [b"x"]}, r"value of label 'a-label' must be a str, not bytes"),
        ({7: "x"}, r"label name must be a str, not int"),
        ("app=shop", r"labels must be a LabelSet, a dict .* not str"),
        ([("app", "shop", "x")], r"expected a \(name, value\) pair"),
    ],
)
def test_labels_of_the_wrong_type_are_rejected(labels, message):
    with pytest.raises(TypeError, match=message):
        LabelSet(labels)


@pytest.mark.parametrize(
    "name, value",
    [
        ("a-label", "a-value"),
        ("a/label", "a%20value"),
        ("a-label", ""),
        ("ünïcode", "ценность"),
        ("digits٣", "x=y"),
        ("n" * 64, "v" * 1024),
        ("a_b.c+d", "-_+/.=%"),
    ],
)
def test_valid_labels_pass(name, value):
    validate_label_name(name)
    validate_label_value(value)
    assert LabelSet({name: value}).values(name) == [value]


def test_well_known_labels_are_valid_gazette_labels():
    names = [L.CONTENT_TYPE, L.MESSAGE_TYPE, L.MESSAGE_SUB_TYPE, L.TAG, L.MANAGED_BY]
    names += [L.INSTANCE, L.REGION, L.NAME, L.PREFIX]
    for name in names:
        validate_label_name(name)
    for value in [L.CONTENT_TYPE_CSV, L.CONTENT_TYPE_JSON_LINES, L.CONTENT_TYPE_PROTOBUF_FIXED]:
        validate_label_value(value)
    assert L.SINGLE_VALUE_LABELS >= {L.CONTENT_TYPE, L.MESSAGE_TYPE, L.REGION}
    assert L.TAG not in L.SINGLE_VALUE_LABELS


def test_single_value_labels_reject_several_values():
    check_single_value_labels({CONTENT_TYPE: CONTENT_TYPE_JSON_LINES, "tag": ["a", "b"]})
    with pytest.raises(ValueError, match=r"label 'content-type' may have only one value"):
        check_single_value_labels({CONTENT_TYPE: ["a/type", "other/type"]})


# -- journal meta-labels ------------------------------------------------------------------


def test_journal_labels_add_name_and_prefix_meta_labels():
    ls = journal_labels("logs/pageviews/part-000", {CONTENT_TYPE: CONTENT_TYPE_JSON_LINES})
    assert ls.value("name") == "logs/pageviews/part-000"
    assert ls.values("prefix") == ["logs/", "logs/pageviews/"]
    assert ls.value(CONTENT_TYPE) == CONTENT_TYPE_JSON_LINES
    # Meta-labels win over a user's labels of the same name; a flat name has no prefix.
    flat = journal_labels("flat", {"name": "spoofed", "prefix": "x/"})
    assert flat.value("name") == "flat" and flat.values("prefix") == ["x/"]


@pytest.mark.parametrize(
    "selector, selected",
    [
        ("name=logs/pageviews/part-000", True),
        ("name=logs/pageviews", False),
        ("name:prefix=logs/page", True),
        ("name:prefix=other/", False),
        ("prefix=logs/", True),
        ("prefix=logs/page", False),  # the prefix meta-label holds whole path components
        ("name:prefix!=logs/", False),
        ("name:prefix notin (other/, more/)", True),
    ],
)
def test_selecting_journals_by_name(selector, selected):
    sel = parse_selector(selector)
    assert sel.matches_journal("logs/pageviews/part-000", {}) is selected
    assert sel.matches(journal_labels("logs/pageviews/part-000")) is selected


# -- selector parsing ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, include, exclude",
    [  # Gazette's own parsing cases, plus prefixes.
        ("foo = bar", {"foo": "bar"}, {}),
        ("foo != bar", {}, {"foo": "bar"}),
        ("foo ", {"foo": ""}, {}),
        (" !foo", {}, {"foo": ""}),
        (" foo in (bing, baz,bar)", {"foo": ["bar", "baz", "bing"]}, {}),
        (" foo not in ( pear, apple )", {}, {"foo": ["apple", "pear"]}),
        (
            "foo==bar, baz !=bing ,apple in (fruit, banana)",
            {"apple": ["banana", "fruit"], "foo": "bar"},
            {"baz": "bing"},
        ),
        (
            "!foo,baz,bing not in (thing-one, thing-2),!bar,",
            {"baz": ""},
            {"bar": "", "bing": ["thing-2", "thing-one"], "foo": ""},
        ),
        (
            "foo = ba=ar, baz=bi=ngo,exc!=who=ops",
            {"foo": "ba=ar", "baz": "bi=ngo"},
            {"exc": "who=ops"},
        ),
        (
            "foo in (bi=ng,ba=ar), exc notin (who=ops,oth=er)",
            {"foo": ["ba=ar", "bi=ng"]},
            {"exc": ["oth=er", "who=ops"]},
        ),
        ("foo=a, foo=b", {"foo": ["a", "b"]}, {}),
        ("name:prefix=logs/", {"name:prefix": "logs/"}, {}),
        ("name:prefix!=logs/", {}, {"name:prefix": "logs/"}),
        ("name:prefix in (a/, b/), name=c", {"name": "c", "name:prefix": ["a/", "b/"]}, {}),
        ("name:prefix notin (a/)", {}, {"name:prefix": "a/"}),
        ("  \t", {}, {}),
        ("", {}, {}),
    ],
)
def test_parse(text, include, exclude):
    sel = parse_selector(text)
    assert sel.include == include
    assert sel.exclude == exclude
    assert sel == LabelSelector(include, exclude)
    assert parse_selector(str(sel)) == sel


def test_canonical_text_is_gazettes():
    sel = parse_selector("foo==bar, baz !=bing ,apple in (fruit, banana), !zed, has")
    assert str(sel) == "apple in (banana,fruit),foo=bar,has,baz!=bing,!zed"
    assert repr(sel) == f"LabelSelector({str(sel)!r})"
    assert str(parse_selector("")) == ""
    # A lone included value starting with '=' is written as a set, so it reads back.
    odd = LabelSelector({"foo": "=x"}, {"bar": "=y"})
    assert str(odd) == "foo in (=x),bar!==y"
    assert parse_selector(str(odd)) == odd


@pytest.mark.parametrize(
    "text, reason, position",
    [
        ("a in (b", "unclosed '('", 5),
        ("foo in (a, b", "unclosed '('", 7),
        ("foo bar", "expected '=', '!=', 'in', 'notin', ',' or the end, found 'b'", 4),
        ("apple,banana err in (bar)", "expected '=', '!=', 'in', 'notin'", 13),
        ("ban=ana in (bar)", "expected ',' or the end, found 'i'", 8),
        ("foo=a|b", "expected ',' or the end, found '|'", 5),
        ("foo:pre=x", "expected ':prefix'", 3),
        ("foo:prefix", "':prefix' needs a value", 10),
        ("!foo:prefix", "':prefix' needs a value", 4),
        ("foo=", "expected a value", 4),
        ("foo !", "expected '!='", 4),
        ("foo in ()", "empty set '()'", 7),
        ("foo in a", "expected '(' after 'in'", 7),
        ("foo not (a)", "expected 'in' after 'not'", 8),
        ("foo in (a b)", "expected ',' or ')', found 'b'", 10),
        ("foo in (a,,b)", "expected a value, found ','", 10),
        (",", "expected a label name or '!'", 0),
        ("foo,,bar", "expected a label name or '!'", 4),
        ("!", "expected a label name after '!'", 1),
        ("!foo=bar", "expected ',' or the end, found '='", 4),
        ("x=1", "invalid label name 'x': length 1 byte, expected 2 to 64", 0),
        ("ok, x in (1,2)", "invalid label name 'x'", 4),
        ("foo, foo in (bar)", "label 'foo' is selected both with any value and with specific", 5),
        ("foo=bar, foo", "label 'foo' is selected both with any value", 9),
        ("foo:prefix=a, foo", "label 'foo' is selected both with any value", 14),
        ("foo=" + "v" * 1025, "invalid label value 'vvv", 4),
    ],
)
def test_bad_selectors_name_the_text_reason_and_position(text, reason, position):
    with pytest.raises(SelectorError) as info:
        parse_selector(text)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.text == text and err.position == position
    assert reason in err.reason
    assert str(err).startswith(f"bad label selector {text!r}: ")
    assert str(err).endswith(f" at {position}")


def test_the_briefs_example_error_message():
    with pytest.raises(SelectorError, match=r"^bad label selector 'a in \(b': unclosed '\(' at 5$"):
        parse_selector("a in (b")


def test_selector_constructor_validates():
    with pytest.raises(ValueError, match="invalid label name 'x'"):
        LabelSelector({"x": "1"})
    with pytest.raises(ValueError, match="'foo:prefix' needs a non-empty prefix value"):
        LabelSelector({"foo:prefix": ""})
    with pytest.raises(ValueError, match="'foo' is selected both with any value and with prefixes"):
        LabelSelector(exclude={"foo": "", "foo:prefix": "a"})
    with pytest.raises(ValueError, match="has the empty value and other values"):
        LabelSelector({"foo": ["", "a"]})


def test_selector_from_value():
    sel = parse_selector("app=shop")
    assert LabelSelector.from_value(sel) is sel
    assert LabelSelector.from_value("app=shop") == sel
    assert LabelSelector.from_value(None) == LabelSelector() == parse_selector("")
    with pytest.raises(TypeError, match="a selector must be a LabelSelector or a str, not int"):
        LabelSelector.from_value(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="selector text must be a str"):
        LabelSelector.parse(b"app=shop")  # type: ignore[arg-type]


def test_selector_is_hashable_and_pickles():
    sel = parse_selector("app in (a,b), name:prefix=x/, !paused")
    assert hash(sel) == hash(parse_selector(str(sel)))
    assert pickle.loads(pickle.dumps(sel)) == sel
    assert {sel: 1}[parse_selector(str(sel))] == 1


# -- matching ------------------------------------------------------------------------------

GAZETTE_SELECTOR = LabelSelector(
    include={"inc-1": "a-val", "inc-2": "", "inc-3": ["val-1", "val-2"]},
    exclude={"exc-1": "", "exc-2": ["val-3", "val-4"]},
)
BASE = {"foo": "bar", "inc-1": "a-val", "inc-2": "any", "inc-3": "val-1"}


@pytest.mark.parametrize(
    "labels, expected",
    [  # Gazette's own matching cases.
        ({}, False),
        (BASE, True),
        ({**BASE, "inc-2": "foo"}, True),  # any value of inc-2
        ({**BASE, "inc-3": "val-2"}, True),  # the other inc-3 value
        ({**BASE, "inc-1": "bad-val"}, False),
        ({k: v for k, v in BASE.items() if k != "inc-2"}, False),
        ({**BASE, "inc-3": "val-other"}, False),
        ({**BASE, "exc-1": "any"}, False),
        ({**BASE, "exc-2": "val-4"}, False),
        ({**BASE, "exc-2": "val-ok"}, True),
        ({**BASE, "inc-3": ["val-other", "val-1"]}, True),  # one matching value suffices
    ],
)
def test_gazette_matching_cases(labels, expected):
    assert GAZETTE_SELECTOR.matches(labels) is expected
    assert GAZETTE_SELECTOR.matches(LabelSet(labels)) is expected


def test_exclude_only_and_empty_selectors():
    sel = LabelSelector(exclude={"exc-1": "", "exc-2": ["val-3", "val-4"]})
    assert sel.matches({})
    assert sel.matches({"foo": "bar"})
    assert sel.matches({"exc-2": "val-ok", "foo": "bar"})
    assert not sel.matches({"exc-2": "val-3", "foo": "bar"})
    assert not sel.matches({"exc-1": "any"})
    everything = parse_selector("")
    assert everything.matches({}) and everything.matches({"any": "thing"})


def test_prefix_matching_in_include_and_exclude():
    inc = parse_selector("topic:prefix=examples/")
    assert inc.matches({"topic": "examples/one"})
    assert inc.matches({"topic": "examples/"})
    assert inc.matches({"topic": ["aaa", "examples/x"]})
    assert not inc.matches({"topic": "example"})
    assert not inc.matches({"topic": "other/examples/x"})
    assert not inc.matches({})
    exc = parse_selector("topic:prefix!=examples/")
    assert exc.matches({})
    assert exc.matches({"topic": "other"})
    assert not exc.matches({"topic": ["other", "examples/x"]})
    # Exact values and prefixes of one name are alternatives, like the values of 'in'.
    mixed = parse_selector("topic=exact, topic:prefix in (a/, b/)")
    assert mixed.matches({"topic": "exact"})
    assert mixed.matches({"topic": "b/1"})
    assert not mixed.matches({"topic": "exactly"})


def test_matches_validates_plain_labels():
    with pytest.raises(ValueError, match="invalid label name 'x'"):
        parse_selector("app=shop").matches({"x": "y"})


# -- properties ------------------------------------------------------------------------------

NAME_CHARS = "abcxyz019-_+/.éЖ٣"
VALUE_CHARS = NAME_CHARS + "=%"
names = st.text(NAME_CHARS, min_size=2, max_size=10)
values = st.text(VALUE_CHARS, min_size=1, max_size=8)


@st.composite
def selectors(draw) -> LabelSelector:
    sides = []
    for _ in range(2):
        side: dict[str, list[str]] = {}
        for name in draw(st.lists(names, max_size=4, unique=True)):
            kind = draw(st.sampled_from(["any", "exact", "prefix", "both"]))
            if kind == "any":
                side[name] = [""]
            if kind in ("exact", "both"):
                side[name] = draw(st.lists(values, min_size=1, max_size=3))
            if kind in ("prefix", "both"):
                side[name + ":prefix"] = draw(st.lists(values, min_size=1, max_size=3))
        sides.append(side)
    return LabelSelector(sides[0], sides[1])


@settings(max_examples=300, deadline=None)
@given(selectors())
def test_canonical_text_parses_back_to_an_equal_selector(sel):
    text = str(sel)
    again = parse_selector(text)
    assert again == sel
    assert str(again) == text


@settings(max_examples=300, deadline=None)
@given(st.text("ab=!,() :\tinotprefx/-", max_size=24))
def test_any_text_parses_or_fails_with_a_position(text):
    try:
        sel = parse_selector(text)
    except SelectorError as err:
        assert 0 <= err.position <= len(text)
        assert err.text == text
    else:
        assert parse_selector(str(sel)) == sel


# A small world of names and values, so that selectors and label sets meet often and
# values prefix one another.
WORLD_NAMES = ["app", "tier", "zone"]
WORLD_VALUES = ["a", "ab", "abc", "b", "x/", "x/y", "x/yz"]


@dataclass(frozen=True)
class Term:
    name: str
    kind: str  # "any", "eq" or "prefix"
    value: str
    exclude: bool

    def hit(self, present: set[str]) -> bool:
        if self.kind == "any":
            return bool(present)
        if self.kind == "eq":
            return self.value in present
        return any(v.startswith(self.value) for v in present)


def reference_matches(terms: list[Term], labels: dict[str, list[str]]) -> bool:
    """The documented semantics, evaluated directly: every included name has a hit among
    its terms (terms of one name are alternatives); no excluded term has a hit."""
    included: dict[str, list[Term]] = defaultdict(list)
    for term in terms:
        present = set(labels.get(term.name, []))
        if term.exclude and term.hit(present):
            return False
        if not term.exclude:
            included[term.name].append(term)
    return all(
        any(t.hit(set(labels.get(name, []))) for t in group) for name, group in included.items()
    )


@st.composite
def world_terms(draw) -> list[Term]:
    terms = []
    for exclude in (False, True):
        for name in draw(st.lists(st.sampled_from(WORLD_NAMES), unique=True, max_size=3)):
            if draw(st.booleans()):
                terms.append(Term(name, "any", "", exclude))
                continue
            for _ in range(draw(st.integers(1, 3))):
                kind = draw(st.sampled_from(["eq", "prefix"]))
                terms.append(Term(name, kind, draw(st.sampled_from(WORLD_VALUES)), exclude))
    return draw(st.permutations(terms))


def render(term: Term, space: str, style: int) -> str:
    key = term.name + (":prefix" if term.kind == "prefix" else "")
    if term.kind == "any":
        return f"{space}!{space}{key}" if term.exclude else f"{space}{key}{space}"
    if style == 0:
        op = "!=" if term.exclude else ("==" if len(space) % 2 else "=")
        return f"{space}{key}{space}{op}{space}{term.value}{space}"
    keyword = ("not in" if style == 1 else "notin") if term.exclude else "in"
    return f"{space}{key} {keyword}{space}({space}{term.value}{space}){space}"


world_labels = st.dictionaries(
    st.sampled_from(WORLD_NAMES), st.lists(st.sampled_from(WORLD_VALUES), min_size=1, max_size=3)
)


@settings(max_examples=400, deadline=None)
@given(world_terms(), world_labels, st.data())
def test_matching_agrees_with_a_direct_evaluation(terms, labels, data):
    n = len(terms)
    spaces = data.draw(st.lists(st.sampled_from(["", " ", "  \t"]), min_size=n, max_size=n))
    styles = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    text = ",".join(render(t, s, y) for t, s, y in zip(terms, spaces, styles))
    if terms and data.draw(st.booleans()):
        text += ","  # a trailing comma is allowed, as in Gazette
    sel = parse_selector(text)
    assert sel.matches(labels) is reference_matches(terms, labels)
    assert parse_selector(str(sel)).matches(labels) is reference_matches(terms, labels)
