"""The Service Bus SQL filter and action language (topics.rules), table-driven:
pure Python, no broker."""

from __future__ import annotations

import datetime as dt

import pytest
from lark import Lark

from topics.rules import (
    SYSTEM_PROPERTIES,
    FilterEvaluationError,
    MessageView,
    SqlSyntaxError,
    compile_action,
    compile_filter,
)

SYSTEM = {
    "messageid": "m1", "correlationid": "c-7", "label": "Order", "to": "store5",
    "contenttype": "application/json", "sequencenumber": 42, "deliverycount": 1,
    "enqueuedtimeutc": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    "timetolive": dt.timedelta(hours=1),
}
USER = {
    "Region": "eu", "amount": 120, "price": 2.5, "Flag": True, "off": False,
    "name": "O'Brien", "nothing": None, "my prop": "spaced", "code": "ABC%1",
    "count": 7, "neg": -7,
}
VIEW = MessageView(SYSTEM, USER)

MATCHES = [
    # property names: scopes, case, delimited and quoted names
    ("user.region = 'eu'", True),
    ("USER.REGION = 'eu'", True),
    ("Region = 'eu'", True),
    ("user.[my prop] = 'spaced'", True),
    ("[my prop] = 'spaced'", True),
    ('"my prop" = \'spaced\'', True),
    ("[and] IS NULL AND android IS NULL AND notes IS NULL AND index IS NULL", True),
    ("sys.Label = 'Order'", True),
    ("sys.subject = 'Order'", True),
    ("SYS.MESSAGEID = 'm1'", True),
    ("sys.CorrelationId = 'c-7' AND sys.To = 'store5'", True),
    ("sys.sequencenumber > 41 and sys.deliverycount = 1", True),
    # literals
    ("name = 'O''Brien'", True),
    ("amount = 120", True),
    ("amount = 120.0", True),
    ("amount = 1.2E2", True),
    ("price = 2.5", True),
    ("price = 25e-1", True),
    ("price = .25E1", True),
    ("TRUE", True),
    ("true", True),
    ("FALSE", False),
    ("NULL", False),
    ("1 = 1", True),
    ("1 = 2", False),
    ("'a' = 'a'", True),
    # comparison
    ("amount <> 100", True),
    ("amount != 120", False),
    ("amount > 119.5", True),
    ("amount >= 120", True),
    ("amount < 120", False),
    ("amount <= 120", True),
    ("name > 'N'", True),
    ("region = 'EU'", False),
    ("'B' < 'a'", True),
    ("flag = TRUE", True),
    ("flag <> FALSE", True),
    ("off = FALSE", True),
    ("flag", True),
    ("off", False),
    ("NOT off", True),
    # three-valued logic: a missing property (or a null one) is UNKNOWN
    ("missing = 1", False),
    ("NOT missing = 1", False),
    ("missing <> 1", False),
    ("nothing = 1", False),
    ("missing", False),
    ("NOT missing", False),
    ("missing = 1 OR amount = 120", True),
    ("missing = 1 AND amount = 120", False),
    ("NOT (missing = 1 AND amount = 120)", False),
    ("NOT (missing = 1 AND amount = 1)", True),
    ("missing = 1 OR amount = 1", False),
    ("NOT (missing = 1 OR amount = 1)", False),
    ("NOT (missing = 1 OR amount = 120)", False),
    ("amount = 1 AND amount > 'x'", False),  # AND stops at FALSE
    # precedence: NOT > AND > OR
    ("amount = 1 AND region = 'x' OR flag", True),
    ("amount = 1 AND (region = 'x' OR flag)", False),
    ("NOT amount = 1 AND flag", True),
    ("NOT flag OR flag", True),
    ("NOT (flag OR flag)", False),
    # IS [NOT] NULL
    ("missing IS NULL", True),
    ("nothing IS NULL", True),
    ("amount IS NULL", False),
    ("amount is not null", True),
    ("missing IS NOT NULL", False),
    ("sys.ReplyTo IS NULL", True),
    ("sys.label IS NOT NULL", True),
    ("amount + missing IS NULL", True),
    # [NOT] IN
    ("region IN ('eu', 'us')", True),
    ("region IN ('us')", False),
    ("region NOT IN ('us', 'apac')", True),
    ("region NOT IN ('eu')", False),
    ("amount IN (1, 120.0)", True),
    ("amount in (-1, 120)", True),
    ("amount IN (count * 10 + 50)", True),
    ("sys.To IN ('Store5', 'store5')", True),
    ("missing IN ('a')", False),
    ("missing NOT IN ('a')", False),
    ("NOT missing IN ('a')", False),
    ("region IN ('eu', NULL)", True),
    ("region IN ('us', NULL)", False),
    ("NOT region IN ('us', NULL)", False),
    ("region NOT IN ('us', NULL)", False),
    # [NOT] LIKE [ESCAPE]
    ("sys.Label LIKE 'Ord%'", True),
    ("sys.Label LIKE 'ord%'", False),
    ("sys.Label LIKE '_rder'", True),
    ("sys.Label LIKE '_der'", False),
    ("sys.Label NOT LIKE '%x%'", True),
    ("region LIKE '%'", True),
    ("code LIKE 'ABC%'", True),
    ("code LIKE 'ABC!%1' ESCAPE '!'", True),
    ("code LIKE 'ABC!%' ESCAPE '!'", False),
    ("code LIKE 'ABC\\%1' ESCAPE '\\'", True),
    ("code LIKE 'A.C%'", False),
    ("name LIKE 'O''B%'", True),
    ("missing LIKE '%'", False),
    ("missing NOT LIKE '%'", False),
    # EXISTS
    ("EXISTS(amount)", True),
    ("EXISTS (user.AMOUNT)", True),
    ("EXISTS([my prop])", True),
    ("EXISTS(missing)", False),
    ("NOT EXISTS(missing)", True),
    ("EXISTS(nothing)", True),
    ("EXISTS(sys.label)", True),
    ("EXISTS(sys.ReplyTo)", False),
    # arithmetic (integer division truncates toward zero, % takes the dividend's sign)
    ("amount + 1 = 121", True),
    ("amount - 20 = 100", True),
    ("amount * 2 = 240", True),
    ("amount / 7 = 17", True),
    ("neg / 2 = -3", True),
    ("neg % 2 = -1", True),
    ("count % 3 = 1", True),
    ("amount / 8.0 = 15", True),
    ("7.5 % 2 = 1.5", True),
    ("-7.5 % 2 = -1.5", True),
    ("price * 2 = 5", True),
    ("-amount = -120", True),
    ("+amount = 120", True),
    ("- -amount = 120", True),
    ("2 + 3 * 4 = 14", True),
    ("(2 + 3) * 4 = 20", True),
    ("10 - 2 - 3 = 5", True),
    ("100 / 10 / 5 = 2", True),
    ("amount + missing = 1", False),
    ("missing * 0 = 0", False),
    ("name + '!' = 'O''Brien!'", True),
    ("sys.EnqueuedTimeUtc + sys.TimeToLive > sys.EnqueuedTimeUtc", True),
    # functions
    ("p('REGION') = 'eu'", True),
    ("property('amount') > 100", True),
    ("p('missing') IS NULL", True),
    ("newid() <> newid()", True),
]


@pytest.mark.parametrize(("expression", "expected"), MATCHES)
def test_filter_matches(expression: str, expected: bool) -> None:
    assert compile_filter(expression).matches(VIEW) is expected


EVALUATION_ERRORS = [
    ("amount > 'abc'", "cannot compare number 120 with string 'abc' in amount > 'abc'"),
    ("flag = 1", "cannot compare boolean TRUE with number 1"),
    ("flag > FALSE", "can only be compared with = or <>"),
    ("sys.EnqueuedTimeUtc > 5", "cannot compare date/time"),
    ("amount / 0 > 1", "division by zero in amount / 0"),
    ("amount % 0 = 1", "division by zero in amount % 0"),
    ("price / 0.0 = 1", "division by zero"),
    ("1 / 0 = 1", "division by zero in 1 / 0"),
    ("sys.NoSuch = 1", "sys.NoSuch is not a system property"),
    ("sys.nosuch IS NULL", "sys.nosuch is not a system property"),
    ("EXISTS(sys.nosuch)", "sys.nosuch is not a system property"),
    ("amount LIKE '1%'", "LIKE needs a string, but amount is number 120"),
    ("region + 1 = 'eu1'", "cannot apply + to string 'eu' and number 1"),
    ("region * 2 = 1", "cannot apply * to string 'eu'"),
    ("flag + 1 = 2", "cannot apply + to boolean TRUE"),
    ("-region = 1", "cannot apply unary - to string 'eu'"),
    ("region", "region is string 'eu', but a filter needs TRUE, FALSE or NULL"),
    ("amount AND flag", "amount is number 120, but AND needs TRUE, FALSE or NULL"),
    ("region IN (1, 2)", "cannot compare string 'eu' with the number values of the list"),
    ("region IN (amount, 'eu')", "cannot compare string 'eu' with number 120"),
    ("p(amount) = 1", "p() needs a property name"),
    ("missing = 1 OR amount > 'x'", "cannot compare number 120 with string 'x'"),
]


@pytest.mark.parametrize(("expression", "message"), EVALUATION_ERRORS)
def test_filter_evaluation_errors(expression: str, message: str) -> None:
    compiled = compile_filter(expression)
    with pytest.raises(FilterEvaluationError) as error:
        compiled.matches(VIEW)
    assert message in str(error.value)


SYNTAX_ERRORS = [
    ("amount = 1 AND", 1, 15, "unexpected end of the rule"),
    ("", 1, 1, "unexpected end of the rule"),
    ("amount = = 1", 1, 10, "unexpected '='"),
    ("user.region = 'eu' AND AND x", 1, 24, "unexpected 'AND'"),
    ("amount = 1 2", 1, 12, "unexpected '2'"),
    ("amount > 100 )", 1, 14, "unexpected ')'"),
    ("(amount > 100", 1, 14, "expected"),
    ("and = 1", 1, 1, "unexpected 'and'"),
    ("amount = 'unterminated", 1, 10, "unexpected character \"'\""),
    ("amount = 1\nAND region LIKE", 2, 16, "expected a 'string', an @parameter"),
    ("region LIKE region", 1, 13, "expected a 'string'"),
    ("region LIKE 'a' ESCAPE 'ab'", 1, 24, "ESCAPE takes one character, not 2"),
    ("region LIKE 'a' ESCAPE ''", 1, 24, "ESCAPE takes one character, not 0"),
    ("region LIKE 'a!' ESCAPE '!'", 1, 13, "ends with its escape character"),
    ("region = @undefined", 1, 10, "parameter @undefined is not defined"),
    ("foo.bar = 1", 1, 1, "unknown scope 'foo'"),
    ("nosuch(1) = 1", 1, 1, "unknown function nosuch()"),
    ("newid(1) = 1", 1, 1, "newid() takes 0 arguments, not 1"),
    ("amount + 1", 1, 1, "a filter needs a condition, but 'amount + 1' is a number"),
    ("'abc'", 1, 1, "a filter needs a condition"),
    ("NOT 'abc'", 1, 5, "NOT needs a condition"),
    ("(amount = 1) * 2 = 2", 1, 2, "cannot apply * to the condition 'amount = 1'"),
]


@pytest.mark.parametrize(("expression", "line", "column", "message"), SYNTAX_ERRORS)
def test_filter_syntax_errors(expression: str, line: int, column: int, message: str) -> None:
    with pytest.raises(SqlSyntaxError) as error:
        compile_filter(expression)
    assert (error.value.line, error.value.column) == (line, column), str(error.value)
    assert message in str(error.value)
    assert str(error.value).startswith(f"syntax error at line {line}, column {column} "
                                       f"(position {error.value.position}): ")


def test_syntax_error_names_what_was_expected() -> None:
    with pytest.raises(SqlSyntaxError) as error:
        compile_filter("user.region = 'eu' AND")
    assert error.value.position == 22
    assert "expected " in str(error.value) and "a property name" in str(error.value)
    assert isinstance(error.value, ValueError)


ACTION_USER = {"Region": "eu", "amount": 120, "tmp": "x"}

ACTIONS = [
    ("SET user.tier = 'gold'", {"Region": "eu", "amount": 120, "tmp": "x", "tier": "gold"}),
    ("SET tier = 'gold'; REMOVE user.tmp", {"Region": "eu", "amount": 120, "tier": "gold"}),
    ("SET amount = amount * 2", {"Region": "eu", "amount": 240, "tmp": "x"}),
    ("SET REGION = 'us'", {"Region": "us", "amount": 120, "tmp": "x"}),
    ("set a = 1; set b = a + 1", {**ACTION_USER, "a": 1, "b": 2}),
    ("SET a = 1 SET b = 2", {**ACTION_USER, "a": 1, "b": 2}),
    ("REMOVE TMP;", {"Region": "eu", "amount": 120}),
    ("REMOVE missing", ACTION_USER),
    ("SET [my prop] = region + '-x'", {**ACTION_USER, "my prop": "eu-x"}),
    ("SET n = NULL", {**ACTION_USER, "n": None}),
    ("SET amount = missing + 1", {"Region": "eu", "amount": None, "tmp": "x"}),
    ("SET t = sys.Label", {**ACTION_USER, "t": "Order"}),
]


@pytest.mark.parametrize(("action", "expected"), ACTIONS)
def test_action_applies(action: str, expected: dict[str, object]) -> None:
    view = MessageView(SYSTEM, dict(ACTION_USER))
    assert compile_action(action).apply(view) == expected
    assert view.user == ACTION_USER and view.user_index["amount"] == 120  # not mutated


@pytest.mark.parametrize(("action", "column", "message"), [
    ("SET sys.Label = 'x'", 5, "SET sys.Label is not supported"),
    ("REMOVE sys.To", 8, "REMOVE sys.To is not supported"),
    ("REMOVE tmp; SET gone = tmp IS NULL", 28, "unexpected 'IS'"),  # SET takes no condition
    ("SET x = @nope", 9, "parameter @nope is not defined"),
    ("SET x", 6, "unexpected end of the rule"),
])
def test_action_syntax_errors(action: str, column: int, message: str) -> None:
    with pytest.raises(SqlSyntaxError) as error:
        compile_action(action)
    assert error.value.column == column, str(error.value)
    assert message in str(error.value)


def test_action_evaluation_error_names_the_expression() -> None:
    action = compile_action("SET amount = region * 2")
    with pytest.raises(FilterEvaluationError, match=r"cannot apply \* to string 'eu'"):
        action.apply(MessageView(SYSTEM, ACTION_USER))


def test_parameters_are_resolved_at_compile_time() -> None:
    compiled = compile_filter("region = @Region AND amount > @min AND sys.label LIKE @pattern",
                              {"@region": "eu", "MIN": 100, "pattern": "Ord%"})
    assert compiled.matches(VIEW)
    assert compile_action("SET x = @v * 2", {"v": 21}).apply(VIEW)["x"] == 42
    with pytest.raises(SqlSyntaxError, match="a parameter must be a str, int, float, bool"):
        compile_filter("region = @r", {"r": ["eu"]})
    with pytest.raises(SqlSyntaxError, match="LIKE pattern must be a string"):
        compile_filter("region LIKE @p", {"p": 5})


def test_lookups_are_case_insensitive_in_both_scopes() -> None:
    view = MessageView({"MessageId": "m9"}, {"CamelCase": 1})
    assert compile_filter("sys.messageid = 'm9' AND camelcase = 1").matches(view)
    assert compile_filter("SYS.MESSAGEID = 'm9' AND [CAMELCASE] = 1").matches(view)


def test_label_and_subject_are_one_system_property() -> None:
    view = MessageView({"subject": "order"}, {})
    for expression in ("sys.Label = 'order'", "sys.Subject = 'order'", "EXISTS(sys.label)"):
        assert compile_filter(expression).matches(view), expression


def test_public_names() -> None:
    required = {"messageid", "correlationid", "to", "replyto", "label", "subject",
                "sessionid", "replytosessionid", "contenttype", "sequencenumber",
                "enqueuedtimeutc", "scheduledenqueuetimeutc", "timetolive", "deliverycount",
                "size", "partitionkey"}
    assert required <= SYSTEM_PROPERTIES
    assert compile_filter("amount > 1").expression == "amount > 1"
    assert compile_action("REMOVE x").expression == "REMOVE x"
    assert issubclass(SqlSyntaxError, ValueError)


def test_a_rule_is_parsed_once_then_evaluated_without_the_parser(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parses = []
    parse = Lark.parse

    def counting_parse(self: Lark, *args: object, **kwargs: object) -> object:
        parses.append(args)
        return parse(self, *args, **kwargs)

    monkeypatch.setattr(Lark, "parse", counting_parse)
    compiled = compile_filter("user.region = 'eu' AND user.amount > 100")
    views = [MessageView(SYSTEM, {"Region": "eu", "amount": n}) for n in range(10_000)]
    assert sum(compiled.matches(view) for view in views) == 10_000 - 101
    assert len(parses) == 1
