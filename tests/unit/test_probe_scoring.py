"""The needle scorer tells a truncated restore, a cross-session mix-up and a model miss apart."""

from kvtier.probe.needles import build_sessions
from kvtier.probe.scoring import DEPTHS, Needle, classify, session_verdict

A = [Needle("a", d, str(1000 + i)) for i, d in enumerate(DEPTHS)]
B = [Needle("b", d, str(2000 + i)) for i, d in enumerate(DEPTHS)]
ALL = A + B


def test_answer_with_the_code_is_found_even_inside_a_sentence():
    assert classify("The code is 1002.", A[2], ALL) == "found"


def test_answer_with_another_sessions_code_is_a_mixup():
    assert classify("2002", A[2], ALL) == "mixup"


def test_answer_with_a_code_of_the_same_session_at_another_depth_is_a_miss():
    assert classify("1003", A[2], ALL) == "miss"


def test_answer_without_numbers_is_a_miss():
    assert classify("I do not know", A[0], ALL) == "miss"


def all_found():
    return dict.fromkeys(DEPTHS, "found")


def test_session_with_every_baseline_needle_found_is_ok():
    assert session_verdict(all_found(), all_found()) == "ok"


def test_needles_the_model_misses_anyway_are_not_blamed_on_the_restore():
    baseline = all_found() | {0.5: "miss"}
    restored = all_found() | {0.5: "miss"}
    assert session_verdict(baseline, restored) == "ok"


def test_losing_only_the_deepest_needles_is_a_truncated_restore():
    restored = all_found() | {0.7: "miss", 0.9: "miss"}
    assert session_verdict(all_found(), restored) == "truncated"


def test_losing_a_middle_needle_while_deeper_ones_survive_is_degraded():
    restored = all_found() | {0.3: "miss"}
    assert session_verdict(all_found(), restored) == "degraded"


def test_any_mixup_wins_over_other_verdicts():
    restored = all_found() | {0.9: "mixup"}
    assert session_verdict(all_found(), restored) == "mixup"


def test_sessions_carry_five_needles_in_depth_order_and_unique_codes():
    sessions = build_sessions(4, 600)
    codes = [n.code for s in sessions for n in s.needles]
    assert len(set(codes)) == len(codes)
    for s in sessions:
        positions = [s.text.index(f"is {n.code}.") for n in s.needles]
        assert positions == sorted(positions)
        assert s.text.startswith(f"Session {s.name}.")
        assert s.name in s.question(s.needles[0])
