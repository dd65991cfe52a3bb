"""TextEnum: the members of imgbuild's enumerations are their words wherever a word was used
before (issue 23: 4), so typing a field changes no output."""

import copy
import json

import jinja2

from buildkit_py.text_enum import TextEnum


class Colour(TextEnum):
    RED = "red"
    DARK_BLUE = "dark-blue"


def test_a_member_prints_formats_and_dumps_as_its_word():
    assert [str(Colour.RED), f"{Colour.RED}", format(Colour.RED), " ".join([Colour.RED])] == ["red"] * 4
    assert f"{Colour.RED:>5}|{Colour.DARK_BLUE!s}|{Colour.RED!r}" == "  red|dark-blue|'red'"
    assert json.dumps({Colour.DARK_BLUE: [Colour.RED]}) == '{"dark-blue": ["red"]}'
    assert jinja2.Template("{{ c }} {{ c | tojson }}").render(c=Colour.RED) == 'red "red"'


def test_a_member_is_equal_to_its_word_and_finds_its_dict_entries():
    assert Colour.RED == "red" and Colour("dark-blue") is Colour.DARK_BLUE
    assert {"red": 1}[Colour.RED] == 1 and {Colour.RED: 1}["red"] == 1  # Enum's own hash is its name's
    assert "red" in {Colour.RED} and Colour.RED in frozenset({"red"})
    assert copy.deepcopy(Colour.RED) is Colour.RED
    assert Colour.words() == ("red", "dark-blue")
