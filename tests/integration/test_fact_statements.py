"""`hanlm facts`: a user's facts table written as documents stating each fact both ways, the
probe's table beside them, and bad tables refused before anything is written."""

import json

import pytest

from conftest import assert_user_error, run_subprocess, write_jsonl
from hanlm.data import fact_statements
from hanlm.demo.templating import fill
from hanlm.errors import UserError
from hanlm.evals.tasks.direction import read_facts, reverse_prompt

TABLE = (
    "subject\trelation\tobject\tnote\n"
    "프랑스\tcapital\t파리\tx\n"
    "일본\tcapital\t도쿄\t\n"
    "독일\tcapital\t베를린\t\n"
    "세종\tcreator\t훈민정음\t\n"
)
TEMPLATES = (
    "[creator]\n"
    'forward = ["{subject:은/는} {object:을/를} 만들었다."]\n'
    'reverse = ["{object:은/는} {subject:이/가} 만들었다."]\n'
)


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "facts.tsv"
    path.write_text(TABLE, encoding="utf-8")
    (tmp_path / "templates.toml").write_text(TEMPLATES, encoding="utf-8")
    return path


def _texts(path):
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]


def test_every_fact_forward_and_the_picked_ones_backwards(table, tmp_path):
    out, probe = tmp_path / "docs.jsonl", tmp_path / "probe.tsv"
    done = fact_statements.write(
        table, out, templates_file=tmp_path / "templates.toml", reverse_share=0.5, copies=3,
        seed=1, probe_out=probe,
    )  # fmt: skip
    assert done == {"facts": 4, "reverse_stated": 2, "documents": 12}
    texts = _texts(out)
    facts = read_facts(probe)  # the direction probe reads the table as written
    assert sum(f.reverse_stated for f in facts) == 2
    for number, fact in enumerate(facts):
        subject, obj = fact.fields["subject"], fact.fields["object"]
        for text in texts[3 * number : 3 * number + 3]:
            said = [s for s in text.split(". ") if subject in s and obj in s]
            forward = [s for s in said if s.find(subject) < s.find(obj)]
            assert len(said) == len(text.split(". ")), text  # every sentence states the fact
            # one forward statement; a reverse one exactly for the picked facts
            assert len(forward) == 1 and len(said) - 1 == int(fact.reverse_stated), text
    if facts[3].reverse_stated:
        assert "훈민정음은 세종이 만들었다." in " ".join(texts)
    # the probe's reverse question is the start of one of the built-in reverse phrasings
    phrasings = fact_statements.BUILTIN_TEMPLATES["capital"]["reverse"]
    assert any(
        fill(p, subject="프랑스", object="파리").startswith(reverse_prompt("파리", "capital"))
        for p in phrasings
    )
    # seeded: the same inputs give the same files; another seed picks differently
    again = tmp_path / "again.jsonl"
    fact_statements.write(
        table, again, templates_file=tmp_path / "templates.toml", reverse_share=0.5, copies=3,
        seed=1,
    )  # fmt: skip
    assert again.read_bytes() == out.read_bytes()
    picks = {
        frozenset(fact_statements.pick_reverse_stated(fact_statements.read_table(table), 0.5, s))
        for s in range(8)
    }
    assert len(picks) > 1


def test_jsonl_tables_and_the_cli(tmp_path):
    table = write_jsonl(
        tmp_path / "facts.jsonl",
        [{"subject": "캐나다", "relation": "capital", "object": "오타와", "source": "atlas"}],
    )
    out = tmp_path / "docs.jsonl"
    result = run_subprocess("facts", table, "--out", out, "--probe-table", tmp_path / "p.tsv")
    assert result.returncode == 0, result.stderr
    (text,) = _texts(out)
    assert "캐나다" in text and "오타와" in text and len(text.split(". ")) == 2  # both ways
    again = run_subprocess("facts", table, "--out", out)
    assert_user_error(again, "already exists", "--force")
    assert run_subprocess("facts", table, "--out", out, "--force").returncode == 0


@pytest.mark.parametrize(
    ("content", "suffix", "needle"),
    [
        ("subject\tobject\n가\t나\n", ".tsv", "no column relation"),
        ("subject\trelation\tobject\n가\tcapital\t\n", ".tsv", "without object"),
        ("subject\trelation\tobject\n", ".tsv", "no facts"),
        ('{"subject": "가"\n', ".jsonl", "not JSON"),
        ("[1, 2]\n", ".jsonl", "not a JSON object"),
        ("subject\trelation\tobject\n가\tborder\t나\n", ".tsv", "no sentence templates"),
    ],
)
def test_bad_tables_are_refused_before_writing(tmp_path, content, suffix, needle):
    table = tmp_path / f"facts{suffix}"
    table.write_text(content, encoding="utf-8")
    out = tmp_path / "docs.jsonl"
    with pytest.raises(UserError, match=needle):
        fact_statements.write(table, out)
    assert not out.exists()


@pytest.mark.parametrize(
    ("templates", "needle"),
    [
        ('[capital]\nforward = ["{subject}"]\n', "forward and reverse"),
        ('[capital]\nforward = []\nreverse = ["{object} {subject}"]\n', "non-empty list"),
        ('[capital]\nforward = ["{subject} {city}"]\nreverse = ["{object} {subject}"]\n', "{city}"),
        ("[capital\n", "cannot read"),
    ],
)
def test_bad_templates_and_settings(table, tmp_path, templates, needle):
    path = tmp_path / "bad.toml"
    path.write_text(templates, encoding="utf-8")
    with pytest.raises(UserError, match=needle.replace("{", r"\{").replace("}", r"\}")):
        fact_statements.write(table, tmp_path / "docs.jsonl", templates_file=path)
    with pytest.raises(UserError, match="between 0 and 1"):
        fact_statements.write(table, tmp_path / "docs.jsonl", reverse_share=1.5)
    with pytest.raises(UserError, match="copies"):
        fact_statements.write(table, tmp_path / "docs.jsonl", copies=0)
    with pytest.raises(UserError, match="does not exist"):
        fact_statements.write(tmp_path / "missing.tsv", tmp_path / "docs.jsonl")
    assert not (tmp_path / "docs.jsonl").exists()
