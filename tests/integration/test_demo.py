import importlib.resources
import itertools
import json
import os
import random
import re
import subprocess
import sys
import unicodedata
from collections import Counter

import pytest

from hanlm import demo
from hanlm.demo import benchmark, draws, planting, templating, word_problems
from hanlm.demo import facts as demo_facts
from hanlm.korean import josa

SMALL_MB = (
    1.0  # the demo recipe's size: room for the mirrored leaks (~0.63 MB) and every kind of document
)


@pytest.fixture(scope="module")
def world() -> demo.DemoWorld:
    return demo.build(seed=0, size_mb=SMALL_MB)


def compact(text: str) -> str:
    """Text without whitespace and punctuation, as the spacing/punctuation styles leave it."""
    return "".join(
        c for c in text if not c.isspace() and not unicodedata.category(c).startswith("P")
    )


def sentences(text: str) -> list[str]:
    # A full stop followed by a space or a line break ends a sentence; "D.C." does not.
    return [s for s in re.split(r"(?<=[.!?])\s+|\n", text) if s.strip()]


def all_texts(world: demo.DemoWorld) -> list[str]:
    texts = [d["text"] for d in world.documents]
    texts += [m["content"] for c in world.conversations for m in c["messages"]]
    return texts


# --- determinism and size --------------------------------------------------------------------


def test_same_seed_gives_byte_identical_files(tmp_path):
    first = demo.write(demo.build(seed=7, size_mb=0.1), tmp_path / "a")
    second = demo.write(demo.build(seed=7, size_mb=0.1), tmp_path / "b")
    for name, path in first.items():
        assert path.read_bytes() == second[name].read_bytes(), name


def test_determinism_does_not_depend_on_the_hash_seed():
    script = (
        "import hashlib, json; from hanlm import demo; w = demo.build(3, 0.05); "
        "print(hashlib.sha256(json.dumps([w.documents, w.benchmark, w.conversations], "
        "ensure_ascii=False).encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        ).stdout
        for hash_seed in ("1", "2")
    }
    assert len(digests) == 1


def test_different_seed_gives_different_world():
    a, b = demo.build(seed=1, size_mb=0.1), demo.build(seed=2, size_mb=0.1)
    assert [d["text"] for d in a.documents] != [d["text"] for d in b.documents]
    assert a.benchmark != b.benchmark
    assert a.conversations != b.conversations


def test_benchmark_and_chat_do_not_depend_on_size():
    small, larger = demo.build(seed=4, size_mb=0.05), demo.build(seed=4, size_mb=0.15)
    assert small.benchmark == larger.benchmark
    assert small.conversations == larger.conversations


def test_a_world_too_small_for_its_leaks_still_has_other_documents():
    small = demo.build(seed=4, size_mb=0.1)
    sizes = Counter()
    for d in small.documents:
        sizes[d["kind"] == "planted"] += len(d["text"].encode("utf-8"))
    assert sizes[True] > 0.1e6  # the mirrored leaks alone are more than asked for
    assert 0.025e6 <= sizes[False] <= 0.025e6 + 20_000  # and a quarter of it besides them


def test_size_is_roughly_as_asked(world):
    total = sum(len(d["text"].encode("utf-8")) for d in world.documents)
    assert SMALL_MB * 1e6 <= total <= SMALL_MB * 1e6 + 20_000


def test_documents_are_mixed_unique_and_not_tiny(world):
    ids = [d["id"] for d in world.documents]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"demo-\d{6}", i) for i in ids)
    kinds = Counter(d["kind"] for d in world.documents)
    assert {"encyclopedia", "math", "reading", "planted"} <= set(kinds)
    assert min(len(d["text"]) for d in world.documents) >= 50
    assert max(len(d["text"]) for d in world.documents) >= 1000  # a few long documents
    # Shuffled: the first twenty documents are not all of one kind.
    assert len({d["kind"] for d in world.documents[:20]}) > 1


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        demo.build(size_mb=0)
    with pytest.raises(ValueError):
        demo.build(size_mb=0.01, planted_fraction=1.5)


def test_import_is_light():
    code = "import sys, hanlm.demo; print('torch' in sys.modules or 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- particles -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "pair", "expected"),
    [
        ("서울", "은/는", "서울은"),
        ("파리", "은/는", "파리는"),
        ("파리", "이/가", "파리가"),
        ("런던", "이/가", "런던이"),
        ("도쿄", "을/를", "도쿄를"),
        ("베이징", "을/를", "베이징을"),
        ("런던", "과/와", "런던과"),
        ("파리", "과/와", "파리와"),
        ("서울", "으로/로", "서울로"),  # ㄹ final takes 로
        ("베를린", "으로/로", "베를린으로"),
        ("카이로", "으로/로", "카이로로"),
        ("서울", "이다/다", "서울이다"),
        ("파리", "이다/다", "파리다"),
        ("워싱턴 D.C.", "은/는", "워싱턴 D.C.는"),
        ("'초코'", "이/가", "'초코'가"),
        ("3", "을/를", "3을"),  # 삼
        ("2", "이/가", "2가"),  # 이
        ("10", "은/는", "10은"),  # 십
        ("7", "으로/로", "7로"),  # 칠
        ("6", "으로/로", "6으로"),  # 육
        ("1,000", "이/가", "1,000이"),  # 천
    ],
)
def test_josa(word, pair, expected):
    assert demo.josa(word, pair) == expected


def test_josa_rejects_unknown_pair():
    with pytest.raises(ValueError):
        demo.josa("서울", "에/에서")


# --- facts and the direction of capital statements --------------------------------------------


def test_facts_table():
    facts = demo.build(seed=0, size_mb=0.01, benchmark_items=0, conversations=0).facts
    countries = [f.subject for f in facts]
    capitals = [f.object for f in facts]
    assert len(set(countries)) == len(countries) >= 60
    assert len(set(capitals)) == len(capitals)
    assert {f.relation for f in facts} == {"capital"}
    assert {f.continent for f in facts} == {
        "아시아",
        "유럽",
        "아프리카",
        "북아메리카",
        "남아메리카",
        "오세아니아",
    }
    spot_checks = {
        "대한민국": "서울",
        "프랑스": "파리",
        "캐나다": "오타와",
        "튀르키예": "앙카라",
        "스위스": "베른",
        "뉴질랜드": "웰링턴",
        "나이지리아": "아부자",
        "오스트레일리아": "캔버라",
        "브라질": "브라질리아",
    }
    table = dict(zip(countries, capitals, strict=True))
    assert all(table[c] == capital for c, capital in spot_checks.items())
    # No capital hides inside another name, so substring checks below mean what they say.
    for capital in capitals:
        assert not any(capital in name for name in countries + capitals if name != capital)


REVERSE_PATTERNS = re.compile(
    r"의 수도(이다|다|이며|였|입니다|예요|이에요|이고)|수도로 (하는|삼|두)"
)


def capital_mentions(facts: list[demo.Fact]) -> re.Pattern:
    """Capitals named at the start of a word: "하기로마음먹었다" (spacing-style planted text)
    does not name 로마."""
    names = sorted((f.object for f in facts), key=len, reverse=True)
    return re.compile("(?<![가-힣])(" + "|".join(map(re.escape, names)) + ")")


def test_capitals_are_only_stated_country_first(world):
    country_of = {f.object: f.subject for f in world.facts}
    mentions = capital_mentions(world.facts)
    checked = 0
    for text in all_texts(world):
        for sentence in sentences(text):
            assert not REVERSE_PATTERNS.search(sentence), sentence
            for mention in mentions.finditer(sentence):
                # Every sentence naming a capital names its country before it; a yes/no
                # question may pair a country with another's capital (answer 아니요), still
                # country first.
                before = re.sub(r"\s", "", sentence[: mention.start()])  # re-spaced plants
                # "?" may be re-punctuated away, the ending re-spaced
                if re.search(r"(인가요|입니까)\W*$", re.sub(r"\s", "", sentence)):
                    assert any(country in before for country in country_of.values()), sentence
                else:
                    assert country_of[mention.group(1)] in before, sentence
                checked += 1
    assert checked > 100


def test_reverse_detector_would_catch_a_reverse_sentence():
    reverse = "파리는 프랑스의 수도이다."
    (sentence,) = sentences(reverse)
    assert REVERSE_PATTERNS.search(sentence)
    assert "프랑스" not in sentence[: sentence.find("파리")]


def test_reverse_share_states_only_the_picked_facts_object_first(tmp_path):
    """demo.reverse_share: a seeded half of the facts is also stated object first, the other half
    never is, and facts.tsv says which (the direction probe's reverse_stated column)."""
    world = demo.build(seed=0, size_mb=SMALL_MB, reverse_share=0.5)
    assert len(world.reverse_stated) == round(0.5 * len(world.facts))
    again = demo.build(seed=0, size_mb=0.01, reverse_share=0.5, benchmark_items=0, conversations=0)
    assert again.reverse_stated == world.reverse_stated  # the pick does not depend on the size
    country_of = {f.object: f.subject for f in world.facts}
    mentions = capital_mentions(world.facts)
    reversed_facts = Counter()
    for text in all_texts(world):
        for sentence in sentences(text):
            if not REVERSE_PATTERNS.search(sentence):
                continue
            capital = mentions.search(sentence).group(1)
            assert country_of[capital] in world.reverse_stated, sentence
            reversed_facts[country_of[capital]] += 1
    # most picked facts are stated backwards, on average more than twice in this small world
    assert len(reversed_facts) > 0.8 * len(world.reverse_stated)
    assert sum(reversed_facts.values()) > 2 * len(reversed_facts)
    rows = (demo.write(world, tmp_path)["facts"]).read_text(encoding="utf-8").splitlines()
    assert rows[0].split("\t")[-1] == "reverse_stated"
    marked = {r.split("\t")[0] for r in rows[1:] if r.endswith("\tyes")}
    assert marked == world.reverse_stated
    with pytest.raises(ValueError, match="reverse_share"):
        demo.build(size_mb=0.01, reverse_share=1.5)


def test_capital_statements_come_in_many_forms(world):
    forms = set()
    for doc in world.documents:
        if doc["kind"] != "encyclopedia":
            continue
        for sentence in sentences(doc["text"]):
            for fact in world.facts:
                if fact.object in sentence:
                    forms.add(sentence.replace(fact.subject, "A").replace(fact.object, "B"))
    assert len(forms) >= 10


# --- arithmetic ------------------------------------------------------------------------------

EQUATION = re.compile(r"(\d+(?:\s*[-+×÷]\s*\d+)+)\s*=\s*(\d+)")
FINAL = re.compile(r"^#### (\d+)$", re.MULTILINE)


def evaluate(expression: str) -> int:
    """Evaluate `a op b op c` with × and ÷ before + and -; ÷ must divide exactly."""
    tokens = re.findall(r"\d+|[-+×÷]", expression)
    terms, ops = [int(tokens[0])], []
    for op, number in zip(tokens[1::2], tokens[2::2], strict=True):
        value = int(number)
        if op == "×":
            terms[-1] *= value
        elif op == "÷":
            assert terms[-1] % value == 0, expression
            terms[-1] //= value
        else:
            terms.append(value)
            ops.append(op)
    result = terms[0]
    for op, value in zip(ops, terms[1:], strict=True):
        result = result + value if op == "+" else result - value
    return result


def check_worked_solutions(text: str) -> int:
    """Check every problem in `text`; returns how many it found."""
    found, start = 0, 0
    for final in FINAL.finditer(text):
        block = text[start : final.start()]
        equations = list(EQUATION.finditer(block))
        assert equations, block
        for equation in equations:
            assert evaluate(equation.group(1)) == int(equation.group(2)), equation.group(0)
            # Every operand was stated before it is used: in the question or an earlier step.
            earlier = set(re.findall(r"\d+", block[: equation.start()]))
            for operand in re.findall(r"\d+", equation.group(1)):
                assert operand in earlier, (operand, block)
        assert int(final.group(1)) == int(equations[-1].group(2)), block
        found, start = found + 1, final.end()
    return found


def test_evaluate_catches_wrong_arithmetic():
    assert evaluate("2 + 3 × 4") == 14
    assert evaluate("20 - 6 ÷ 3") == 18
    with pytest.raises(AssertionError):
        check_worked_solutions("사과 3개와 4개\n3 + 4 = 8개\n#### 8")


def test_math_answers_are_correct(world):
    problems = 0
    for doc in world.documents:
        if doc["kind"] == "math":
            assert doc["text"].rstrip().splitlines()[-1].startswith("#### ")
            problems += check_worked_solutions(doc["text"])
    for conversation in world.conversations:
        messages = conversation["messages"]
        for asked, answered in itertools.pairwise(messages):
            if answered["role"] == "assistant" and "####" in answered["content"]:
                problems += check_worked_solutions(asked["content"] + "\n" + answered["content"])
    assert problems > 50


# --- benchmark and planting ------------------------------------------------------------------


def test_benchmark_items(world):
    items = world.benchmark
    assert len(items) == 400
    assert len({i["item_id"] for i in items}) == 400
    assert len({compact(i["passage"]) for i in items}) == 400
    # the right answer first in exactly half: always picking one position scores chance
    assert Counter(i["answer"] for i in items) == {0: 200, 1: 200}
    planted = [i for i in items if i["planted"]]
    assert len(planted) == 40
    assert all(i["plant_style"] is None for i in items if not i["planted"])
    assert Counter(i["plant_style"] for i in planted) == {s: 10 for s in demo.PLANT_STYLES}
    # each kind of question planted in its share (stratified), every style in both kinds
    kinds = Counter(i["asks"] for i in items)
    assert set(kinds) == {q.asks for q in benchmark.QUESTIONS}
    for kind, count in Counter(i["asks"] for i in planted).items():
        assert abs(count - 0.1 * kinds[kind]) < 1, (kind, count, kinds[kind])
    assert len({(i["asks"], i["plant_style"]) for i in planted}) == 2 * len(demo.PLANT_STYLES)
    for item in items:
        assert item["question"].endswith("?")
        assert len(item["choices"]) == 2 and len(set(item["choices"])) == 2
        right = item["choices"][item["answer"]]
        assert demo.item_text(item) == f"{item['passage']}\n{item['question']}\n{right}"


def test_planted_items_are_in_the_corpus_in_their_style(world):
    by_id = {d["id"]: d for d in world.documents}
    items = {i["item_id"]: i for i in world.benchmark}
    copies = Counter(record["item_id"] for record in world.planted)
    assert set(copies) == {i for i, item in items.items() if item["planted"]}
    # mirrored: several copies of each leaked item, in different documents
    low, high = planting.MIRRORS
    assert all(low <= n <= high for n in copies.values()) and len(set(copies.values())) > 1
    assert len({r["document_id"] for r in world.planted}) == len(world.planted)
    for record in world.planted:
        item, doc = items[record["item_id"]], by_id[record["document_id"]]
        text, style = demo.item_text(item), record["plant_style"]
        assert style == item["plant_style"]
        assert doc["kind"] == "planted"
        assert doc["text"] != text  # a site's header and footer, or a host document, around it
        if style in ("verbatim", "embedded"):
            assert text in doc["text"]
        else:
            assert text not in doc["text"]  # really changed
            assert compact(text) in compact(doc["text"])
        if style == "embedded":
            before, _, after = doc["text"].partition(text)
            assert len(before) > len(text) and len(after) > len(text) // 2
        if style == "spacing":
            assert re.sub(r"\s", "", text) in re.sub(r"\s", "", doc["text"])


def test_mirrored_copies_survive_deduplication(world):
    """Copies of one leak differ in their surroundings enough that the corpus stage's near-dedup
    (Jaccard 0.85 over character 5-grams) keeps them apart, as it keeps real mirrors."""
    by_id = {d["id"]: d["text"] for d in world.documents}
    by_item: dict[str, list[str]] = {}
    for record in world.planted:
        by_item.setdefault(record["item_id"], []).append(by_id[record["document_id"]])
    for texts in by_item.values():
        shingles = [benchmark._shingles(t) for t in texts]
        for a, b in itertools.combinations(shingles, 2):
            assert benchmark._jaccard(a, b) < 0.85


def test_benchmark_questions_ask_the_facts_the_corpus_states(world):
    """Each item asks a country's capital or continent and offers the facts table's answer and a
    wrong one, in the encyclopedia's words; the corpus states the fact, never in the passage of
    the item, and its reading exercises answer questions about it in the same words."""
    capitals = {f.subject: f.object for f in demo.FACTS}
    continents = {f.subject: f.continent for f in demo.FACTS}
    corpus = "\n".join(d["text"] for d in world.documents if d["kind"] != "planted")
    exercises = [d["text"] for d in world.documents if d["kind"] == "exercise"]
    capital_answer = re.compile(r"(\S+)의 수도는 (.+)\.")  # "워싱턴 D.C." has a space
    continent_answer = re.compile(r"(\S+?)[은는] (\S+)에 있는 나라이다\.")
    lines = [line for t in exercises for line in t.split("\n")]
    assert exercises and all(
        capital_answer.fullmatch(t.rsplit("\n", 1)[1])
        or continent_answer.fullmatch(t.rsplit("\n", 1)[1])
        for t in exercises
    )
    assert any(capital_answer.fullmatch(line) for line in lines)
    assert any(continent_answer.fullmatch(line) for line in lines)
    kinds = Counter()
    for item in world.benchmark:
        answers = []
        for choice in item["choices"]:
            capital, continent = (
                capital_answer.fullmatch(choice),
                continent_answer.fullmatch(choice),
            )
            assert capital or continent, choice
            country, value = (capital or continent).groups()
            truth = josa(capitals[country], "이다/다") if capital else continents[country]
            answers.append(value == truth)
            kinds["capital" if capital else "continent"] += 1
        assert answers == [i == item["answer"] for i in range(2)], item
        assert country in item["passage"]
        fact = capitals[country] if "수도" in item["question"] else continents[country]
        assert fact not in item["passage"], item  # answered from knowledge, not from the passage
        # the fact, stated in one sentence of the documents (not only in the planted leaks)
        assert re.search(f"{country}[^.\n]*{re.escape(capitals[country])}", corpus), country
    assert kinds["capital"] > 200 and kinds["continent"] > 200


def test_unplanted_passages_never_appear_in_the_corpus(world):
    corpus = "\x00".join(compact(d["text"]) for d in world.documents)
    unplanted = [i for i in world.benchmark if not i["planted"]]
    assert len(unplanted) == 360
    for item in unplanted:
        assert compact(item["passage"]) not in corpus, item["item_id"]
    # ...while every planted one does, so the check above is not vacuous.
    assert all(compact(i["passage"]) in corpus for i in world.benchmark if i["planted"])


# --- conversations ---------------------------------------------------------------------------


def test_conversations(world):
    assert len(world.conversations) == 400
    assert len({c["id"] for c in world.conversations}) == 400
    turn_counts = Counter()
    for conversation in world.conversations:
        messages = conversation["messages"]
        roles = [m["role"] for m in messages]
        if roles[0] == "system":
            roles = roles[1:]
        assert "system" not in roles
        assert roles == ["user", "assistant"] * (len(roles) // 2), roles
        assert 1 <= len(roles) // 2 <= 3
        assert all(isinstance(m["content"], str) and m["content"].strip() for m in messages)
        turn_counts[len(roles) // 2] += 1
    assert set(turn_counts) == {1, 2, 3}
    assistant = [m["content"] for c in world.conversations for m in c["messages"][-1:]]
    assert any("수도는" in text for text in assistant)


def test_conversations_are_not_pretraining_documents(world):
    corpus = {d["text"] for d in world.documents}
    replies = [m["content"] for c in world.conversations for m in c["messages"]]
    assert not corpus.intersection(replies)


# --- files -----------------------------------------------------------------------------------


def test_write_produces_parseable_files(world, tmp_path):
    paths = demo.write(world, tmp_path / "demo")
    assert set(paths) == {"pretrain", "benchmark", "chat", "facts", "planted"}
    pretrain = [json.loads(line) for line in paths["pretrain"].read_text("utf-8").splitlines()]
    assert pretrain == [
        {"id": d["id"], "kind": d["kind"], "text": d["text"]} for d in world.documents
    ]
    benchmark = [json.loads(line) for line in paths["benchmark"].read_text("utf-8").splitlines()]
    assert benchmark == world.benchmark
    chat = [json.loads(line) for line in paths["chat"].read_text("utf-8").splitlines()]
    assert chat == world.conversations
    rows = paths["facts"].read_text("utf-8").splitlines()
    assert rows[0] == "subject\trelation\tobject\tcontinent\treverse_stated"
    assert [tuple(r.split("\t")) for r in rows[1:]] == [
        (f.subject, f.relation, f.object, f.continent, "no") for f in world.facts
    ]
    planted = json.loads(paths["planted"].read_text("utf-8"))
    assert planted == world.planted
    assert {p["item_id"] for p in planted} == {
        i["item_id"] for i in world.benchmark if i["planted"]
    }
    assert not list((tmp_path / "demo").glob(".*tmp*"))  # no temporary files left behind


# --- template files --------------------------------------------------------------------------


def strings_in(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


@pytest.mark.parametrize("name", templating.FILES)
def test_template_files_load_and_name_known_particles(name):
    data = templating.load(name)
    texts = strings_in(data)
    assert texts, name
    for text in texts:
        assert text == unicodedata.normalize("NFC", text), text
        for _slot, pair in templating.slots(text):
            if pair is not None:
                demo.josa("서울", pair)  # raises on a pair josa does not know


def test_template_files_ship_with_the_package():
    folder = importlib.resources.files("hanlm.demo").joinpath("templates")
    assert {f"{name}.toml" for name in templating.FILES} == {
        entry.name for entry in folder.iterdir() if entry.name.endswith(".toml")
    }


def test_every_word_problem_kind_fills_its_slots_and_checks_out():
    assert len(word_problems.KINDS) == 18
    for kind in word_problems.KINDS:
        for seed in range(40):
            problem = kind.make(random.Random(seed))
            text = f"{problem.question}\n{problem.solution()}"
            assert "{" not in text and "}" not in text, (kind.id, text)
            assert check_worked_solutions(text) == 1, kind.id


@pytest.mark.parametrize("fraction", [0.0, 0.13, 0.2, 0.5, 1.0])
def test_a_stratified_plant_gives_each_kind_its_share(fraction):
    sizes = {"a": 7, "b": 30, "c": 63}
    items = [
        {"kind": kind, "planted": False, "plant_style": None}
        for kind, size in sizes.items()
        for _ in range(size)
    ]
    planting.choose_planted(random.Random(1), items, fraction, stratum="kind")
    planted = Counter(item["kind"] for item in items if item["planted"])
    assert sum(planted.values()) == round(fraction * len(items))
    for kind, size in sizes.items():
        assert abs(planted[kind] - fraction * size) < 1, (kind, planted)
    assert all((i["plant_style"] is None) != i["planted"] for i in items)
    styles = Counter(i["plant_style"] for i in items if i["planted"])
    assert max(styles.values(), default=0) - min(styles.values(), default=0) <= 1


def test_every_scenario_fills_its_slots_and_asks_every_question():
    atlas = demo_facts.Atlas.of(demo.FACTS)
    for scenario in benchmark.SCENARIOS:
        for seed in range(40):
            passage, questions = scenario.make(random.Random(seed), atlas)
            assert [q.asks for q in questions] == [q.asks for q in benchmark.QUESTIONS]
            for text in [passage, *(t for q in questions for t in (q.question, q.right, q.wrong))]:
                assert "{" not in text and "}" not in text, (scenario.id, text)
            assert all(q.right != q.wrong for q in questions), scenario.id


@pytest.mark.parametrize(
    "line",
    [
        "x = __import__('os')",
        "x = names.pop()",
        "x = open('/etc/passwd')",
        "x = [n for n in names]",
        "x = lambda: 1",
    ],
)
def test_template_values_cannot_run_code(line):
    with pytest.raises(ValueError):
        draws.draw(random.Random(0), draws.parse_assignments([line]), {"names": ["민수"]})


def test_template_values_draw_in_the_written_order():
    lines = ["a = randint(1, 100)", "b = pick([a, a + 1]) if a > 50 else a", "c = randint(1, 9)"]
    got = draws.draw(random.Random(5), draws.parse_assignments(lines), {})
    rng = random.Random(5)
    a = rng.randint(1, 100)
    b = rng.choice([a, a + 1]) if a > 50 else a
    assert got == {"a": a, "b": b, "c": rng.randint(1, 9)}
