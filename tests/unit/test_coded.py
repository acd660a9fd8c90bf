"""``analysis.coded``: text columns as integer codes, whatever shape the column comes in."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from hpcwatch.analysis.coded import Coded, as_text, joint_codes

texts = st.lists(st.one_of(st.none(), st.sampled_from(["", "a", "b", "node10", "node2", "None", "é"])), max_size=30)


def _chunked(values: list[str | None], cut: int) -> pa.ChunkedArray:
    cut = min(cut, len(values))
    return pa.chunked_array([pa.array(values[:cut], pa.string()), pa.array(values[cut:], pa.string())])


@given(texts, st.integers(0, 30))
def test_codes_give_back_the_values_from_text_chunks_dictionaries_and_python_values(values, cut) -> None:
    column = _chunked(values, cut)
    dictionary = pa.chunked_array(
        [c.dictionary_encode() for c in column.chunks], type=pa.dictionary(pa.int32(), pa.string())
    )
    for coded in (Coded.of(column), Coded.of(dictionary), Coded.of(column.combine_chunks()), Coded.of_values(values)):
        assert coded.values().tolist() == values
        assert len(coded) == len(values) and all(c == -1 for c, v in zip(coded.codes, values) if v is None)


@given(texts)
def test_ranks_sort_as_the_values_written_as_text(values) -> None:
    ranks = Coded.of(pa.array(values, pa.string())).ranks()
    as_text = [str(v) for v in values]
    for i in range(len(values)):
        for j in range(len(values)):
            assert (ranks[i] < ranks[j]) == (as_text[i] < as_text[j])


@given(st.lists(st.tuples(st.sampled_from([None, "h1", "h2"]), st.sampled_from([None, "0", "1", ""])), max_size=30))
def test_joint_codes_tell_apart_exactly_the_distinct_tuples(rows) -> None:
    hosts, gpus = Coded.of_values(r[0] for r in rows), Coded.of_values(r[1] for r in rows)
    codes, tuples = joint_codes(hosts, gpus)
    assert [tuples[c] for c in codes] == rows
    assert len(tuples) == len(set(rows))


def test_a_value_no_row_holds_has_a_code_no_row_has() -> None:
    coded = Coded.of(pa.array(["a", None], pa.string()))
    assert coded.code("a") == 0 and coded.code("zzz") not in coded.codes.tolist()


@given(texts)
def test_as_text_gives_the_text_of_an_encoded_column_and_leaves_text_alone(values) -> None:
    column = pa.chunked_array([pa.array(values, pa.string())])
    assert as_text(column.dictionary_encode()).type == pa.string()
    assert as_text(column.dictionary_encode()).to_pylist() == values
    assert as_text(column) is column
