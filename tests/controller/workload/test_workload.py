"""Workload generators, trace loaders and SLAs (docs/design.md §4)."""

import json

import numpy as np
import pytest

from controller.errors import InputError
from controller.workload import SLA, chatbot, default_sla, load_trace, summarization
from controller.workload.base import Workload


def test_generators_match_published_means():
    c, s = chatbot(n=50000), summarization(n=50000)
    assert c.mean_input == pytest.approx(161, rel=0.05)
    assert c.mean_output == pytest.approx(338, rel=0.05)
    assert s.mean_input == pytest.approx(1738, rel=0.1)  # clipped to the 2048 context
    assert np.all(c.inputs + c.outputs <= 2048) and np.all(s.inputs + s.outputs <= 2048)


def test_length_biased_kv_tokens_hand_worked():
    # two requests: (l=100, o=10) and (l=0, o=90). Each joins decode with l + 1 tokens and
    # holds l + 1 + t at its t-th of o - 1 steps: 9 steps averaging 101 + 4 = 105 tokens and
    # 89 steps averaging 1 + 44 = 45, so (9 * 105 + 89 * 45) / 98
    w = Workload("x", np.array([100, 0]), np.array([10, 90]))
    assert w.mean_kv_tokens == pytest.approx((9 * 105 + 89 * 45) / 98)


def test_requests_that_end_at_prefill_reach_no_decode():
    # (l=100, o=10) and (l=300, o=1): the second ends at its first token, at prefill
    w = Workload("x", np.array([100, 300]), np.array([10, 1]))
    assert w.decode_share == 0.5
    assert w.mean_kv_transfer_tokens == 100.0  # the prompt of the one that decodes
    assert w.mean_kv_tokens == pytest.approx(101 + 4)  # 9 steps at 101..109 tokens
    assert w.mean_decode_steps == 4.5  # (9 + 0) / 2
    none = Workload("y", np.array([100, 300]), np.array([1, 1]))
    assert none.decode_share == 0.0
    assert none.mean_kv_transfer_tokens == 200.0  # nothing moves: the mean prompt
    assert none.mean_kv_tokens == 201.0


def test_poisson_arrivals_have_the_asked_rate():
    reqs = chatbot(n=1000).requests(rate=20.0, n=20000, seed=1)
    span = reqs[-1].arrival_s - reqs[0].arrival_s
    assert len(reqs) / span == pytest.approx(20.0, rel=0.03)
    gaps = np.diff([r.arrival_s for r in chatbot(n=100).requests(5.0, 20000, seed=2, cv=4.0)])
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(4.0, rel=0.15)


def test_csv_json_and_sharegpt_traces(tmp_path):
    (tmp_path / "t.csv").write_text("input_tokens,output_tokens,arrival_s\n10,5,0.0\n20,7,0.5\n")
    w = load_trace(tmp_path / "t.csv")
    assert list(w.inputs) == [10, 20] and list(w.outputs) == [5, 7]
    assert list(w.arrivals) == [0.0, 0.5]
    (tmp_path / "t.json").write_text(json.dumps([{"input_tokens": 3, "output_tokens": 4}]))
    assert list(load_trace(tmp_path / "t.json").inputs) == [3]
    share = [
        {"conversations": [{"from": "human", "value": "x" * 41}, {"from": "gpt", "value": "y" * 8}]}
    ]
    (tmp_path / "s.json").write_text(json.dumps(share))
    w = load_trace(tmp_path / "s.json")
    assert list(w.inputs) == [11] and list(w.outputs) == [2]  # ceil(chars / 4)


def _share(*turns):
    return json.dumps([{"id": "x", "conversations": list(turns)}])


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.csv", "input_tokens\n3\n", "needs columns"),
        ("b.csv", "input_tokens,output_tokens\n3,-1\n", "line 2: output_tokens: must be positive"),
        ("c.json", "{not json", "not valid JSON"),
        ("d.json", "[]", "non-empty JSON list"),
        # non-numeric and NaN arrivals, malformed ShareGPT conversations
        ("e.csv", "input_tokens,output_tokens,arrival_s\n3,4,soon\n", "2: arrival_s: not a number"),
        ("f.csv", "input_tokens,output_tokens,arrival_s\n3,4,nan\n", "arrival_s: must be a finite"),
        (
            "g.csv",
            "input_tokens,output_tokens,arrival_s\n3,4,1\n3,4,\n",
            "line 3: arrival_s missing",
        ),
        ("h.csv", "input_tokens,output_tokens,arival_s\n3,4,1\n", "did you mean arrival_s?"),
        ("i.csv", "input_tokens,output_tokens\n3,4,5\n", "line 2: 3 cells, header has 2"),
        ("j.csv", "input_tokens,output_tokens\n1000000000000,4\n", "must be at most 1048576"),
        ("k.csv", "input_tokens,output_tokens\n2.5,4\n", "must be an integer, got 2.5"),
        (
            "l.json",
            '[{"input_tokens": 3, "output_tokens": 4, "arrival_s": NaN}]',
            "must be a finite",
        ),
        ("m.json", '[{"input_tokens": 3, "output_tokens": "4"}]', "[0].output_tokens: must be an"),
        ("n.json", '[{"input_tokens": 3, "output_tokens": 4, "extra": 1}]', "[0]: key 3: unknown"),
        ("o.json", '[{"conversation": []}]', "[0]: key 1: unknown key (did you mean conv"),
        ("p.json", '[{"conversations": "hi"}]', "[0].conversations: must be a list of turns"),
        ("q.json", _share({"from": "human"}), "[0].conversations[0]: missing 'value'"),
        ("r.json", _share({"from": "human", "value": 5}), "conversations[0].value: must be a str"),
        ("s.json", _share("hi"), "conversations[0]: a turn must be a mapping"),
        ("t.json", _share({"from": "human", "value": "hi"}), "no requests found"),
        ("u.json", '[{"input_tokens": 3, "output_tokens": 4}, 7]', "[1]: must be a request"),
    ],
)
def test_bad_traces_name_the_problem(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError) as e:
        load_trace(tmp_path / name)
    assert str(e.value).startswith(str(tmp_path / name)) and message in str(e.value)


def test_sharegpt_ignores_other_keys_and_unpaired_turns(tmp_path):
    text = _share(
        {"from": "system", "value": "be brief", "markdown": None},
        {"from": "human", "value": "x" * 9},
        {"from": "gpt", "value": "y" * 4},
        {"from": "human", "value": "unanswered"},
    )
    (tmp_path / "s.json").write_text(text)
    w = load_trace(tmp_path / "s.json")
    assert list(w.inputs) == [3] and list(w.outputs) == [1] and w.arrivals is None


def test_sla_defaults_and_validation():
    assert default_sla("chatbot") == SLA(2.5, 0.15)
    assert default_sla("summarization", "large") == SLA(25.0, 0.2)
    with pytest.raises(InputError):
        SLA(0, 0.1)
