"""Look-alike local copies of KMMLU, HAE-RAE Bench and CLIcK in their published layouts, as
`hf download REPO --repo-type dataset --local-dir DIR/REPO` writes them: a few dozen made-up
Korean items per config, with each dataset card's fields, so that lm-evaluation-harness's own
task definitions read them unchanged (only `dataset_path` points here).

- HAERAE-HUB/KMMLU: `data/{Subject}-{train,dev,test}.csv` (Korean-History's files are
  lower-case, `korean-history-*`, as published), columns question, answer (1-4), A-D, Category,
  Human Accuracy; README `configs:` maps each subject to its files.
- HAERAE-HUB/HAE_RAE_BENCH: a parquet file per config (`{config}/test-00000-of-00001.parquet`),
  columns query (instruction, question, options (A)-(E), "### 정답:"), answer "(A)".."(E)",
  options; README `configs:`.
- EunsuKim/CLIcK: JSON arrays under `Dataset/<area>/<category>/<Name>.json`, records id,
  paragraph, question, choices, answer (the right choice's text); no `configs:` block, so every
  file is the default config's train split. lm-eval's CLIcK tasks pick rows by `id`.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path


def _registry_folder(family: str) -> str:
    import lm_eval

    return str(Path(lm_eval.__file__).parent / "tasks" / family)


class _Folders(dict):
    """lm-eval's task folder of a family (kmmlu, haerae, click), looked up when first asked."""

    def __missing__(self, family: str) -> str:
        return _registry_folder(family)


REGISTRY_FOLDERS = _Folders()

SUBJECTS = {"Accounting": "Accounting", "Korean-History": "korean-history"}
HAERAE_CONFIGS = (
    "general_knowledge",
    "history",
    "loan_words",
    "rare_words",
    "standard_nomenclature",
)
CLICK_FILES = {  # file -> the id prefix lm-eval's process_docs select on
    "Dataset/Culture/Korean Economy/Economy_Kedu.json": "Kedu_economy",
    "Dataset/Culture/Korean History/History_Kedu.json": "Kedu_history",
}

_NOUNS = (
    "회계 기준", "재무제표", "감가상각", "조선 왕조", "고려 시대", "훈민정음", "삼국 통일", "자본 잠식",
    "부가가치세", "실학 운동", "갑오개혁", "현금 흐름", "유동 부채", "향약", "과거 제도", "대동법",
)  # fmt: skip
_VERBS = (
    "설명으로 옳은 것은",
    "특징으로 옳지 않은 것은",
    "사례로 가장 알맞은 것은",
    "원인으로 적절한 것은",
)
_ANSWERS = (
    "정해진 기간마다 같은 금액을 비용으로 나누어 인식한다", "왕권을 강화하기 위하여 제도를 정비하였다",
    "지방 사족이 자치 규약을 만들어 향촌을 다스렸다", "거래가 일어난 시점에 수익과 비용을 기록한다",
    "백성이 쉽게 익혀 쓸 수 있도록 새 문자를 만들었다", "공납을 쌀로 통일하여 거두도록 하였다",
    "자산의 장부 금액이 회수 가능액을 넘으면 손실을 인식한다", "신분제를 폐지하고 근대적 개혁을 추진하였다",
)  # fmt: skip


def _question(rng: random.Random, i: int) -> str:
    a, b = rng.sample(_NOUNS, 2)
    return f"{a}와 {b}의 관계를 다룬 {i}번째 자료를 읽고, {a}에 관한 {rng.choice(_VERBS)}?"


def _options(rng: random.Random, n: int) -> list[str]:
    return [f"{text} ({rng.randint(1, 999)})" for text in rng.sample(_ANSWERS, n)]


def kmmlu_rows(subject: str, split: str, count: int) -> list[dict]:
    rng = random.Random(f"kmmlu/{subject}/{split}")
    rows = []
    for i in range(count):
        options = _options(rng, 4)
        rows.append(
            {
                "question": _question(rng, i),
                "answer": rng.randint(1, 4),
                **dict(zip("ABCD", options, strict=True)),
                "Category": subject.replace("-", " "),
                "Human Accuracy": round(rng.random(), 4),
            }
        )
    return rows


def write_kmmlu(root: Path, count: int = 24) -> Path:
    repo = root / "HAERAE-HUB" / "KMMLU"
    (repo / "data").mkdir(parents=True, exist_ok=True)
    configs = []
    for subject, stem in SUBJECTS.items():
        files = []
        for split, n in (("train", 4), ("dev", 5), ("test", count)):
            path = f"data/{stem}-{split}.csv"
            with open(repo / path, "w", encoding="utf-8", newline="") as f:
                rows = kmmlu_rows(subject, split, n)
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
            files.append(f"  - split: {split}\n    path: {path}")
        configs.append(f"- config_name: {subject}\n  data_files:\n" + "\n".join(files))
    _readme(repo, configs)
    return repo


def haerae_rows(config: str, count: int) -> list[dict]:
    rng = random.Random(f"haerae/{config}")
    rows = []
    for i in range(count):
        options = _options(rng, 5)
        listed = "\n".join(f"({label}) {o}" for label, o in zip("ABCDE", options, strict=True))
        query = (
            "다음 질문을 읽고 정답으로 가장 알맞은 것을 고르시요.\n### 질문: \n"
            f"{_question(rng, i)}\n\n### 선택지: \n{listed}\n\n### 정답:"
        )
        rows.append({"query": query, "answer": f"({rng.choice('ABCDE')})", "options": str(options)})
    return rows


def write_haerae(root: Path, count: int = 20) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    repo = root / "HAERAE-HUB" / "HAE_RAE_BENCH"
    configs = []
    for config in HAERAE_CONFIGS:
        path = f"{config}/test-00000-of-00001.parquet"
        (repo / config).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(haerae_rows(config, count)), repo / path)
        configs.append(f"- config_name: {config}\n  data_files:\n  - split: test\n    path: {path}")
    _readme(repo, configs)
    return repo


def click_rows(prefix: str, count: int) -> list[dict]:
    rng = random.Random(f"click/{prefix}")
    rows = []
    for i in range(count):
        choices = _options(rng, 4)
        rows.append(
            {
                "id": f"{prefix}_{i + 1}",
                "paragraph": "" if i % 3 else f"다음은 {rng.choice(_NOUNS)}에 대한 설명이다.",
                "question": _question(rng, i),
                "choices": choices,
                "answer": rng.choice(choices),
            }
        )
    return rows


def write_click(root: Path, count: int = 16) -> Path:
    repo = root / "EunsuKim" / "CLIcK"
    for name, prefix in CLICK_FILES.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(click_rows(prefix, count), ensure_ascii=False), "utf-8")
    (repo / "README.md").write_text(
        "---\nlanguage:\n- ko\ntask_categories:\n- multiple-choice\n---\n# CLIcK (look-alike)\n",
        "utf-8",
    )
    return repo


def write_all(root: Path) -> Path:
    write_kmmlu(root)
    write_haerae(root)
    write_click(root)
    return root


def _readme(repo: Path, configs: list[str]) -> None:
    text = "---\nconfigs:\n" + "\n".join(configs) + "\n---\n# look-alike for hanlm's tests\n"
    (repo / "README.md").write_text(text, "utf-8")
