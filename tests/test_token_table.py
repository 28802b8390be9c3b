"""The control plane's token table (``flows/step/token_table.py``): the stored rows, compact."""

import pytest

from actions.contracts import PromptTokens, parse_token_table
from flows.step.token_table import TokenTable

RAW = {"7": {"prompt": [5, 6, 7, 70_000], "answer_len": 3}, "2": {"prompt": [], "answer_len": 0},
       "11": {"prompt": [1] * 40, "answer_len": 12}}


def test_rows_are_the_stored_rows_in_the_stored_order():
    table = TokenTable(RAW, "runs/r/data/tokens.json")
    assert dict(table) == parse_token_table(RAW) and list(table) == [7, 2, 11]
    assert table[7] == PromptTokens(prompt=[5, 6, 7, 70_000], answer_len=3) and 7 in table and 8 not in table
    assert table.prompt_lengths() == [4, 0, 40] and len(table) == 3
    assert sorted(table) == [2, 7, 11]  # what the schedule draws prompts from


@pytest.mark.parametrize("row,damage", [
    ({"prompt": [1, -2], "answer_len": 3}, "negative"),
    ({"prompt": [1, 2.5], "answer_len": 3}, "'float'"),
    ({"prompt": "ab", "answer_len": 1}, "not a list of token ids"),
    ({"prompt": [1], "answer_len": -1}, "answer_len -1 is not a count"),
    ({"prompt": [1], "answer_len": True}, "answer_len True is not a count"),
    ({"prompt": [1]}, "not an object of prompt and answer_len"),
])
def test_a_damaged_row_is_named_with_its_key(row, damage):
    with pytest.raises(ValueError, match=rf"^runs/r/data/tokens.json: prompt '4': .*{damage}.*damaged"):
        TokenTable({"3": {"prompt": [1], "answer_len": 1}, "4": row}, "runs/r/data/tokens.json")
    with pytest.raises(ValueError, match="prompt 'x': invalid literal"):
        TokenTable({"x": {"prompt": [1], "answer_len": 1}}, "t")
