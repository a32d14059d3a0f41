"""Chat data and special tokens: the loss mask, bad inputs, the audit and the initialisation
(tied and untied heads)."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig

from conftest import write_jsonl
from hanlm.chat import tokens
from hanlm.data import chat_data
from hanlm.errors import UserError
from hanlm.model import PRESETS, build_model, model_config

CONVERSATION = [
    {"role": "system", "content": "너는 친절한 도우미야."},
    {"role": "user", "content": "프랑스의 수도는 어디야?"},
    {"role": "assistant", "content": "파리입니다."},
    {"role": "user", "content": "고마워!"},
    {"role": "assistant", "content": "천만에요."},
]


@pytest.fixture(scope="module")
def tokenizer(demo_run):
    return AutoTokenizer.from_pretrained(str(demo_run / "tokenizer"))


@pytest.fixture(scope="module")
def special(demo_run):
    return tokens.load_special_tokens(demo_run / "tokenizer")


def test_loss_mask_has_every_end_of_turn_and_no_user_token(tokenizer, special):
    eot, pad = special["eot"]["id"], special["pad"]["id"]
    assert pad not in (eot, special["eod"]["id"])
    ids, mask = chat_data.tokenize(tokenizer, CONVERSATION, eot)
    for packing in (True, False):
        rows, masks, _, too_long = chat_data.build_rows([(ids, mask)] * 3, 64, pad, packing=packing)
        assert too_long == 0
        _, labels = chat_data.labels_of(rows, masks)
        trained = labels[labels != chat_data.IGNORE]
        assert (trained == eot).sum() == 2 * 3  # each assistant turn's <|eot|>, every copy
        assert pad not in trained.tolist()
        text = tokenizer.decode(trained.tolist())
        assert "파리입니다" in text and "천만에요" in text
        for turn in CONVERSATION:
            if turn["role"] != "assistant":
                assert turn["content"] not in text
        for role in ("<|user|>", "<|system|>", "<|assistant|>"):
            assert role not in text
    # padding: one conversation per row, the rest <|pad|> and never a label
    rows, masks, _, _ = chat_data.build_rows([(ids, mask)] * 3, 64, pad, packing=False)
    assert len(rows) == 3 and (rows[:, len(ids) :] == pad).all()
    packed, _, _, _ = chat_data.build_rows([(ids, mask)] * 3, 2 * len(ids), pad, packing=True)
    assert len(packed) == 2


def test_too_long_conversations_are_dropped_not_cut(tokenizer, special):
    ids, mask = chat_data.tokenize(tokenizer, CONVERSATION, special["eot"]["id"])
    rows, _, _, too_long = chat_data.build_rows([(ids, mask)], len(ids) - 5, 2, packing=True)
    assert too_long == 1 and len(rows) == 0


def test_loader_resumes_exactly(tokenizer, special):
    ids, mask = chat_data.tokenize(tokenizer, CONVERSATION, special["eot"]["id"])
    rows, masks, _, _ = chat_data.build_rows([(ids, mask)] * 10, 64, 2, packing=False)
    a = chat_data.ChatLoader(rows, masks, micro_batch=3, seed=1)
    b = chat_data.ChatLoader(rows, masks, micro_batch=3, seed=1)
    for _ in range(4):
        a.next_batch()
    b.load_state_dict(a.state_dict())
    for _ in range(3):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    with pytest.raises(UserError, match="changed"):
        chat_data.ChatLoader(rows[:9], masks[:9], micro_batch=3).load_state_dict(a.state_dict())


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "not valid JSON"),
        ('{"messages": [{"role": "bot", "content": "x"}]}', "unknown role 'bot'"),
        ('{"messages": [{"role": "user", "content": "x"}]}', "no assistant turn"),
        ('{"messages": []}', "no messages"),
        ('{"messages": [{"role": "user", "content": 3}]}', "no text content"),
        ('{"messages": [{"role": "assistant", "content": "a<|eot|>b"}]}', "template token"),
        ("[1, 2]", "not an object"),
    ],
)
def test_bad_chat_data_names_file_and_line(tmp_path, line, needle):
    good = json.dumps({"messages": CONVERSATION}, ensure_ascii=False)
    path = tmp_path / "chat.jsonl"
    path.write_text(good + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        chat_data.read_conversations(path)
    assert needle in info.value.what and f"{path}:2" in info.value.where


def test_empty_or_missing_chat_data(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(UserError, match="no conversations"):
        chat_data.read_conversations(empty)
    with pytest.raises(UserError, match="does not exist"):
        chat_data.read_conversations(tmp_path / "missing.jsonl")
    rows = write_jsonl(tmp_path / "ok.jsonl", [{"id": "a", "messages": CONVERSATION}])
    assert chat_data.read_conversations(rows)[0]["id"] == "a"


def untied_model(tmp_path, vocab):
    config = LlamaConfig(**{**PRESETS["tiny"], "tie_word_embeddings": False})
    config.save_pretrained(tmp_path / "untied")
    mconfig = model_config(str(tmp_path / "untied" / "config.json"), vocab_size=vocab, seq_len=64)
    assert not mconfig.tie_word_embeddings
    return build_model(mconfig, seed=0)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("method", ["mean", "mean-cov", "text", "none"])
def test_audit_and_initialisation(tmp_path, special, tokenizer, tied, method):
    vocab = special["vocab_size"]
    if tied:
        model = build_model(model_config("tiny", vocab_size=vocab, seq_len=64), seed=0)
    else:
        model = untied_model(tmp_path, vocab)
    counts = {special[n]["token"]: 0 for n in ("system", "user", "assistant", "eot")}
    counts[special["eod"]["token"]] = 100
    report = tokens.audit(model, special, counts)
    assert report["tied"] is tied
    assert report["untrained_template_tokens"] == ["system", "user", "assistant", "eot"]
    eot_row = next(t for t in report["tokens"] if t["name"] == "eot")
    assert eot_row["pretrain_count"] == 0 and eot_row["verdict"] == "untrained"
    assert ("head_norm" in eot_row) is (not tied)
    json.dumps(report)  # audit.json
    tokens.print_audit(report)

    ids = [special[n]["id"] for n in report["untrained_template_tokens"]]
    before = {k: w.detach().clone() for k, w in tokens.matrices(model).items()}
    text_ids = tokenizer.encode("서울", add_special_tokens=False)
    tokens.initialise(model, ids, method, special, text_ids=text_ids, seed=0)
    weights = tokens.matrices(model)
    assert set(weights) == ({"embedding"} if tied else {"embedding", "head"})
    excluded = [v["id"] for v in special.values() if isinstance(v, dict)]
    excluded += tokens.reference_ids(special)
    ordinary = tokens.ordinary_ids(vocab, excluded)
    for name, weight in weights.items():
        rows = weight.detach()[ids]
        if method == "none":
            assert torch.equal(rows, before[name][ids])
            continue
        if method == "mean":
            expected = before[name][ordinary].mean(0)
            torch.testing.assert_close(rows, expected.expand_as(rows))
        elif method == "text":
            expected = before[name][text_ids].mean(0)
            torch.testing.assert_close(rows, expected.expand_as(rows))
        else:  # a sample close to the mean, one per token
            mean = before[name][ordinary].mean(0)
            assert (rows - mean).abs().max() < 0.05 and not torch.equal(rows[0], rows[1])
        others = [i for i in range(vocab) if i not in ids]
        assert torch.equal(weight.detach()[others], before[name][others])
    if not tied and method == "mean":  # the head got its own mean, not the embedding's
        assert not torch.allclose(weights["head"][ids[0]], weights["embedding"][ids[0]])


def test_row_step_scale_stretches_only_the_new_rows(special):
    model = build_model(model_config("tiny", vocab_size=special["vocab_size"], seq_len=64))
    ids = [special["eot"]["id"]]
    runs = {}
    for scale in (1.0, 5.0):
        m = build_model(model.config, seed=0)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.0)
        if scale != 1.0:
            tokens.RowStepScale(opt, m, ids, scale)
        start = m.get_input_embeddings().weight.detach().clone()
        x = torch.tensor([[7, 8, ids[0], 9, 10]])
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
        runs[scale] = m.get_input_embeddings().weight.detach() - start
    torch.testing.assert_close(runs[5.0][ids], 5 * runs[1.0][ids])
    torch.testing.assert_close(runs[5.0][20:], runs[1.0][20:])


def test_geometry_flags_rows_like_the_unused_ones(special):
    """Rows pushed the way the reserved (never seen) rows were are flagged; ordinary are not."""
    model = build_model(model_config("tiny", vocab_size=special["vocab_size"], seq_len=64))
    weight = model.get_input_embeddings().weight
    push = torch.randn(weight.shape[1], generator=torch.Generator().manual_seed(0))
    unused = [*tokens.reference_ids(special), special["eot"]["id"]]
    with torch.no_grad():
        weight[unused] += 0.2 * push / push.norm() * weight.norm(dim=1).median() * 5
    geo = tokens.geometry(model, [special["eot"]["id"], 300, 400], special)
    assert geo["under_trained"] == [True, False, False]
    assert np.isfinite(geo["matrices"]["embedding"]["values"]["cos_reference"][0])


def test_row_norms_tell_trained_rows_from_template_rows(special):
    """Rows grown by training stand out from the template rows that kept their start."""
    model = build_model(model_config("tiny", vocab_size=special["vocab_size"], seq_len=64), seed=0)
    weight = tokens.matrices(model)["embedding"]
    excluded = [v["id"] for v in special.values() if isinstance(v, dict)]
    ordinary = tokens.ordinary_ids(len(weight), excluded + tokens.reference_ids(special))
    with torch.no_grad():
        weight[torch.as_tensor(ordinary)] *= 3.0  # what training did to the ordinary rows
    norms = tokens.row_norms(model, special)
    start = norms["initial_norm"]
    assert start == pytest.approx(0.02 * 64**0.5, rel=1e-3)  # tiny: initializer_range x sqrt(64)
    assert norms["embedding"]["ordinary_mean"] == pytest.approx(3 * start, rel=0.1)
    assert set(norms["embedding"]["template"]) == {"system", "user", "assistant", "eot"}
    for value in norms["embedding"]["template"].values():
        assert value == pytest.approx(start, rel=0.3)
    assert "head" not in norms  # tied: one matrix


def test_end_of_answer_ranks_match_one_conversation_at_a_time(tmp_path, tokenizer, special):
    """Batched with right padding, each answer end is ranked as in its own forward pass."""
    from hanlm.chat.closure import end_of_answer_ranks

    eot = special["eot"]["id"]
    model = untied_model(tmp_path, special["vocab_size"])  # its head can change alone
    short = CONVERSATION[1:3]
    examples = [chat_data.tokenize(tokenizer, c, eot) for c in (CONVERSATION, short, CONVERSATION)]
    expected = []
    with torch.no_grad():
        for ids, mask in examples:
            logits = model(input_ids=torch.as_tensor([ids])).logits[0]
            for i, token in enumerate(ids):
                if token == eot and mask[i]:
                    expected.append(int((logits[i - 1] > logits[i - 1, eot]).sum()))
    result = end_of_answer_ranks(model, examples, end_of_turn_id=eot, batch_size=2)
    assert result["answers"] == len(expected) == 5  # 2 + 1 + 2 assistant turns
    assert result["median_rank"] == sorted(expected)[len(expected) // 2]
    assert result["mean_rank"] == pytest.approx(sum(expected) / len(expected), abs=0.01)
    assert result["top1"] == pytest.approx(sum(r == 0 for r in expected) / len(expected))
    assert result["mean_logprob"] < 0
    # a head of zeros: every logit ties with <|eot|>'s, and a tie does not outrank it
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    on_top = end_of_answer_ranks(model, examples[:1], end_of_turn_id=eot)
    assert on_top["top1"] == 1.0 and on_top["median_rank"] == 0
    with pytest.raises(UserError, match="no answer end"):
        end_of_answer_ranks(
            model, [(examples[0][0], [0] * len(examples[0][0]))], end_of_turn_id=eot
        )
