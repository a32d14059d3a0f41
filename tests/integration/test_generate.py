"""Decoding: the processors transformers lacks, batch generation, `hanlm generate`, and the
repetition penalty measured on a model that repeats."""

import json
import shutil

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from conftest import (
    TINY_PRETRAIN,
    assert_user_error,
    run_subprocess,
    trained_and_exported,
    write_jsonl,
)
from damaged_models import DAMAGES, damaged_copy
from hanlm.config import GenerateSection
from hanlm.evals.tasks import repetition
from hanlm.inference import (
    FrequencyPresencePenalty,
    SparingRepetitionPenalty,
    encode,
    exempt_token_ids,
    generate,
    load,
    logits_processors,
    prompt_budget,
)

GREEDY = GenerateSection(greedy=True, repetition_penalty=1.0, max_new_tokens=16)


@pytest.fixture(scope="module")
def model_dir(demo_run, tmp_path_factory):
    """A tiny model trained 8 steps on the demo world and exported. So little training leaves a
    model that falls into loops: greedy decoding repeats a few frequent tokens."""
    values = {**TINY_PRETRAIN, "logging.eval_every": 8, "checkpoint.every": 8}
    return trained_and_exported(demo_run, tmp_path_factory.mktemp("generate") / "run", values)


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load(model_dir, device="cpu")


@pytest.fixture(scope="module")
def demo_prompts(demo_run):
    rows = [json.loads(line) for line in (demo_run / "demo" / "pretrain.jsonl").open()]
    return [row["text"][:30] for row in rows[:6]]


# --- processors ------------------------------------------------------------------------------------


def test_repetition_penalty_spares_exempt_tokens():
    scores = torch.tensor([[2.0, -1.0, 3.0, 0.5, 4.0]])
    input_ids = torch.tensor([[0, 1, 4, 4]])  # token 4 plays the end-of-turn token
    exempt = torch.tensor([4])
    out = SparingRepetitionPenalty(2.0, exempt)(input_ids, scores.clone())
    plain = RepetitionPenaltyLogitsProcessor(2.0)(input_ids, scores.clone())
    assert out[0, 4] == 4.0  # seen, but exempt: unchanged
    assert plain[0, 4] == 2.0  # what transformers alone would do to it
    assert out[0, :4].tolist() == [1.0, -2.0, 3.0, 0.5]  # CTRL rule on 0 and 1 only


def test_frequency_and_presence_penalties_count_only_the_answer():
    scores = torch.zeros(1, 6)
    # prompt: 1 1 (length 2); answer so far: 2 2 3 5 (5 exempt)
    input_ids = torch.tensor([[1, 1, 2, 2, 3, 5]])
    processor = FrequencyPresencePenalty(0.5, 0.25, prompt_length=2, exempt_ids=torch.tensor([5]))
    out = processor(input_ids, scores)
    assert out[0].tolist() == pytest.approx([0, 0, -(2 * 0.5 + 0.25), -(0.5 + 0.25), 0, 0])


def test_exempt_ids_are_the_special_tokens_and_optionally_common_words(loaded):
    tok = loaded.tokenizer
    eot = tok.convert_tokens_to_ids("<|eot|>")
    special = exempt_token_ids(tok, GenerateSection(), loaded.vocab_size)
    assert eot in special.tolist() and tok.eos_token_id in special.tolist()
    assert (
        exempt_token_ids(
            tok, GenerateSection(exempt_special_tokens=False), loaded.vocab_size
        ).numel()
        == 0
    )
    words = exempt_token_ids(
        tok,
        GenerateSection(exempt_special_tokens=False, exempt_common_words=True),
        loaded.vocab_size,
    )
    texts = {tok.decode([i]).strip() for i in words.tolist()}
    assert texts and texts <= set(GenerateSection().common_words)
    assert "." in texts


def test_processor_order_and_greedy(loaded):
    sampled = GenerateSection(
        repetition_penalty=1.3, frequency_penalty=0.1, no_repeat_ngram_size=3, top_k=5, top_p=0.9
    )
    names = [type(p).__name__ for p in logits_processors(sampled, loaded.tokenizer, 1024, 4)]
    assert names == [
        "SparingRepetitionPenalty",
        "FrequencyPresencePenalty",
        "NoRepeatNGramLogitsProcessor",
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
    ]
    assert logits_processors(GREEDY, loaded.tokenizer, 1024, 4) == []


# --- the penalty on a model that repeats ------------------------------------------------------------


def test_penalty_lowers_seq_rep_4_on_a_looping_model(model_dir, demo_prompts):
    # Fixed-length continuations (end tokens barred until 24), as seq-rep is defined: with the
    # penalty and free to stop, this model ends its answers after a few tokens instead of looping.
    without = GREEDY.model_copy(update={"max_new_tokens": 24, "min_new_tokens": 24})
    with_penalty = without.model_copy(update={"repetition_penalty": 2.0})
    result = repetition.evaluate(model_dir, demo_prompts[:4], without, with_penalty)
    print(repetition.markdown(result))
    assert result["without"]["seq_rep_4"] > 0.5, "the fixture model should loop"
    assert result["with"]["seq_rep_4"] < result["without"]["seq_rep_4"] - 0.2
    assert result["with"]["distinct_2"] > result["without"]["distinct_2"]
    assert len(result["samples"]) == 4


def test_end_of_turn_keeps_its_logit_and_probability(loaded):
    """In a chat prompt the end-of-turn token has already occurred; the penalty leaves it be."""
    tok = loaded.tokenizer
    eot = tok.convert_tokens_to_ids("<|eot|>")
    text = tok.apply_chat_template(
        [{"role": "user", "content": "서울은 어디에 있나요?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    input_ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert eot in input_ids[0].tolist()
    with torch.no_grad():
        logits = loaded.model(input_ids=input_ids).logits[:, -1, :]
    settings = GREEDY.model_copy(
        update={"repetition_penalty": 1.8, "frequency_penalty": 1.0, "presence_penalty": 1.0}
    )
    processed = logits_processors(settings, tok, loaded.vocab_size, 2)(input_ids, logits.clone())
    assert processed[0, eot] == logits[0, eot]
    assert torch.softmax(processed, -1)[0, eot] >= torch.softmax(logits, -1)[0, eot]
    # whereas the plain transformers rule lowers it
    plain = RepetitionPenaltyLogitsProcessor(1.8)(input_ids, logits.clone())
    assert plain[0, eot] != logits[0, eot]


# --- generation ------------------------------------------------------------------------------------


def test_batches_give_the_same_answers_as_one_at_a_time(loaded, demo_prompts):
    prompts = [demo_prompts[0], demo_prompts[1][:5]]  # different lengths: left padding
    together = generate(loaded, prompts, GREEDY.model_copy(update={"batch_size": 2}))
    alone = [generate(loaded, [p], GREEDY)[0] for p in prompts]
    assert [r["token_ids"] for r in together] == [r["token_ids"] for r in alone]
    assert all(r["finish_reason"] in ("stop", "length") for r in together)


def test_sampling_is_seeded(loaded, demo_prompts):
    settings = GenerateSection(max_new_tokens=8, temperature=1.5, top_k=0, top_p=1.0)
    first = generate(loaded, demo_prompts[:2], settings)
    again = generate(loaded, demo_prompts[:2], settings)
    other = generate(loaded, demo_prompts[:2], settings.model_copy(update={"seed": 1}))
    assert [r["token_ids"] for r in first] == [r["token_ids"] for r in again]
    assert [r["token_ids"] for r in first] != [r["token_ids"] for r in other]


def test_generate_cli_writes_jsonl(cli, model_dir, tmp_path):
    out = tmp_path / "answers.jsonl"
    result = cli(
        "generate", model_dir, "--prompt", "서울은", "--prompt", "한국의 수도는",
        "--greedy", "--max-new-tokens", "6", "--repetition-penalty", "1.3",
        "--out", out, "--run", tmp_path / "norun",
    )  # fmt: skip
    assert result.code == 0, result.err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["서울은", "한국의 수도는"]
    assert all(r["new_tokens"] <= 6 and "text" in r for r in rows)
    assert "--- 2/2" in result.out


def test_generate_cli_prompts_file_and_chat(cli, model_dir, tmp_path):
    prompts = write_jsonl(
        tmp_path / "p.jsonl",
        [{"prompt": "안녕하세요"}, {"messages": [{"role": "user", "content": "안녕"}]}],
    )
    out = tmp_path / "answers.jsonl"
    result = cli(
        "generate", model_dir, "--prompts", prompts, "--chat", "--max-new-tokens", "4",
        "--seed", "3", "--out", out, "--run", tmp_path / "norun",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert len(out.read_text().splitlines()) == 2


def test_generate_cli_bad_inputs(cli, model_dir, tmp_path):
    norun = ["--run", tmp_path / "norun"]
    assert_user_error(
        cli("generate", tmp_path / "nothing", "--prompt", "x", *norun),
        "not a Hugging Face model folder",
    )
    assert_user_error(cli("generate", model_dir, *norun), "--prompt TEXT")
    assert_user_error(
        cli("generate", model_dir, "--prompt", "x", "--greedy", "--top-k", "3", *norun),
        "--greedy takes no",
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": 3}\n')
    assert_user_error(cli("generate", model_dir, "--prompts", bad, *norun), "bad.jsonl:2")
    no_template = tmp_path / "no_template"
    shutil.copytree(model_dir, no_template)
    config = json.loads((no_template / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (no_template / "tokenizer_config.json").write_text(json.dumps(config))
    assert_user_error(
        cli("generate", no_template, "--prompt", "x", "--chat", *norun),
        "no chat template",
    )
    assert_user_error(
        cli("generate", model_dir, "--prompt", "x", "--set", "generate.top_p=3", *norun),
        "generate.top_p",
    )


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_generate_refuses_a_damaged_model_folder(cli, model_dir, tmp_path, damage):
    folder, phrase = damaged_copy(model_dir, tmp_path / "model", damage)
    result = cli("generate", folder, "--prompt", "서울은", "--run", tmp_path / "norun")
    assert_user_error(result, phrase)


def test_generate_without_tokenizer_files_says_so(cli, model_dir, tmp_path):
    folder, _ = damaged_copy(model_dir, tmp_path / "model", "no tokenizer")
    result = cli("generate", folder, "--prompt", "서울은", "--run", tmp_path / "norun")
    assert_user_error(result, "has no tokenizer files", "tokenizer.json", "hanlm export")
    assert "sentencepiece" not in result.err.lower()


def test_a_prompt_longer_than_the_context_keeps_its_last_tokens(loaded):
    context = loaded.model.config.max_position_embeddings
    text = "서울은 한국의 수도이다. " * 8000  # about 100k characters against 64 positions
    whole = loaded.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    budget = prompt_budget(context, GREEDY.max_new_tokens)
    assert budget == context - GREEDY.max_new_tokens and len(whole) > budget
    batch = encode(loaded, [text, "서울은"], GREEDY.max_new_tokens)
    assert batch["input_ids"][0].tolist() == whole[-budget:]  # the most recent tokens
    assert batch["attention_mask"][1].sum() == len(loaded.tokenizer("서울은")["input_ids"])
    assert prompt_budget(64, 1000) == 32  # a long answer still leaves half the context


def test_generate_cli_warns_how_many_prompt_tokens_were_dropped(cli, model_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("서울은 한국의 수도이다. " * 8000 + "\n서울은\n", encoding="utf-8")
    out = tmp_path / "answers.jsonl"
    result = cli(
        "generate", model_dir, "--prompts", prompts, "--greedy", "--max-new-tokens", "4",
        "--out", out, "--run", tmp_path / "norun",
    )  # fmt: skip
    assert result.code == 0, result.err
    [line] = [line for line in result.err.splitlines() if "dropped" in line]
    assert line.startswith("warning: prompt 1 has") and "the last 60 kept" in line
    assert len(out.read_text().splitlines()) == 2


def test_generate_out_replaces_an_earlier_answers_file_only_with_force(cli, model_dir, tmp_path):
    out = tmp_path / "answers.jsonl"
    args = ("generate", model_dir, "--prompt", "서울은", "--max-new-tokens", "3", "--greedy")
    args += ("--run", tmp_path / "norun", "--out", out)
    assert cli(*args).code == 0
    before = out.read_bytes()
    assert_user_error(cli(*args, "--max-new-tokens", "2"), "earlier output", "--force")
    assert out.read_bytes() == before
    # as a user runs it: a real process, where torchao's CUDA-less import noise would show
    result = run_subprocess(*args, "--max-new-tokens", "2", "--force")
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["new_tokens"] <= 2
    assert "Failed to load" not in result.stderr and "register_constant" not in result.stderr
