"""hanlm.data.minhash: vectorised MinHash signatures and exact-content hashes.

Spacing and batching invariance, determinism across processes, short and empty texts, several
num_perm values, and the statistical check: over pairs of synthetic Hangul texts with a known
shingle-set Jaccard J, the fraction of equal columns is unbiased and spreads no more than the
binomial sqrt(J(1-J)/num_perm) of classic MinHash.
"""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from conftest import ROOT
from hanlm.data.minhash import FOLDED, content_hashes, signatures

HANGUL = [chr(c) for c in range(0xAC00, 0xD7A4)]  # precomposed (NFC) syllables
PARAMS = {"num_perm": 128, "ngram": 5, "seed": 0}


def hangul(rng: random.Random, length: int) -> str:
    return "".join(rng.choices(HANGUL, k=length))


def spaced(rng: random.Random, text: str) -> str:
    """The same characters with random whitespace of several kinds between them."""
    gaps = [" ", "  ", "\n", "\t", "\u3000", "\xa0", "\r\n", "\u2009"]
    return "".join(c + (rng.choice(gaps) if rng.random() < 0.3 else "") for c in text)


def shingle_set(text: str, n: int) -> set[str]:
    compact = "".join(text.split())  # (the texts of these tests hold no punctuation)
    return {compact[i : i + n] for i in range(max(1, len(compact) - n + 1))}


def estimate(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a == b).mean(axis=-1)


# ---------------------------------------------------------------------------------------------
# Invariances and determinism


def test_spacing_does_not_matter():
    rng = random.Random(1)
    texts = [hangul(rng, n) for n in (3, 5, 40, 700)] + ["나는 학교에 간다"]
    plain = ["".join(t.split()) for t in texts]
    variants = [spaced(rng, t) for t in plain]
    assert np.array_equal(signatures(plain, **PARAMS), signatures(variants, **PARAMS))
    assert np.array_equal(
        signatures(["나는 학교에"], **PARAMS), signatures(["나는학교에"], **PARAMS)
    )


def test_whitespace_is_what_str_split_splits_on():
    every = [chr(c) for c in range(0x3100) if chr(c).isspace()]
    text = "가나다라마바사아자차"
    with_all = "".join(c + "".join(every) for c in text)
    assert "".join(with_all.split()) == text
    assert np.array_equal(signatures([with_all], **PARAMS), signatures([text], **PARAMS))
    # a zero-width space is not whitespace to str.split, so it is a character here too
    assert not np.array_equal(
        signatures(["가나다\u200b라마바"], **PARAMS), signatures(["가나다라마바"], **PARAMS)
    )


def test_punctuation_and_case_are_folded_and_digits_are_not():
    text = "대한민국의 수도는 서울이다. 인구는 약 940만 명이고, Seoul이라고도 부른다!"
    punctuated = "대한민국의 수도는 서울이다… 인구는 약 940만 명이고 SEOUL이라고도 부른다?!"
    assert np.array_equal(signatures([text], **PARAMS), signatures([punctuated], **PARAMS))
    no_marks = "".join(c for c in text if c not in ".,!…?")
    assert np.array_equal(signatures([text], **PARAMS), signatures([no_marks], **PARAMS))
    # a number is part of the text: a word problem with other numbers is another problem
    other_number = text.replace("940", "510")
    assert not np.array_equal(signatures([text], **PARAMS), signatures([other_number], **PARAMS))
    # letters are not dropped, however rare: beyond the BMP too
    assert not np.array_equal(
        signatures(["가나다😀라마바"], **PARAMS), signatures(["가나다라마바"], **PARAMS)
    )
    assert "digits kept" in FOLDED


def test_batching_does_not_matter():
    rng = random.Random(2)
    texts = [hangul(rng, rng.choice([0, 1, 4, 5, 6, 30, 300, 3000])) for _ in range(60)]
    texts = [spaced(rng, t) for t in texts]
    whole = signatures(texts, **PARAMS)
    parts = np.vstack([signatures(texts[i : i + 7], **PARAMS) for i in range(0, 60, 7)])
    one_by_one = np.vstack([signatures([t], **PARAMS) for t in texts])
    assert whole.shape == (60, 128) and whole.dtype == np.uint32
    assert np.array_equal(whole, parts)
    assert np.array_equal(whole, one_by_one)
    halves = np.vstack([signatures(texts[:30], **PARAMS), signatures(texts[30:], **PARAMS)])
    assert np.array_equal(whole, halves)


def test_batches_larger_than_one_chunk(monkeypatch):
    from hanlm.data import minhash

    rng = random.Random(3)
    texts = [hangul(rng, rng.choice([2, 50, 400])) for _ in range(40)]
    whole = signatures(texts, **PARAMS)
    monkeypatch.setattr(minhash, "_CHUNK_CHARS", 500)
    assert np.array_equal(whole, signatures(texts, **PARAMS))


def test_same_result_in_a_fresh_process():
    texts = ["대한민국의 수도는 서울이다. 한강이 도시를 가로지른다.", "", "가나", "ab c\u3000d"]
    code = (
        "import sys, json; from hanlm.data.minhash import signatures, content_hashes; "
        "texts = json.loads(sys.stdin.read()); "
        "print(signatures(texts, num_perm=64, ngram=5, seed=7).tobytes().hex()); "
        "print(content_hashes(texts).tobytes().hex())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "12345", "PATH": ""},
    ).stdout.split()
    assert out[0] == signatures(texts, num_perm=64, ngram=5, seed=7).tobytes().hex()
    assert out[1] == content_hashes(texts).tobytes().hex()


def test_seed_changes_the_signature():
    text = ["대한민국의 수도는 서울이다"]
    a = signatures(text, num_perm=64, ngram=5, seed=0)
    b = signatures(text, num_perm=64, ngram=5, seed=1)
    assert estimate(a, b)[0] < 0.2
    assert np.array_equal(a, signatures(text, num_perm=64, ngram=5, seed=0))


# ---------------------------------------------------------------------------------------------
# Short texts and parameters


def test_short_and_empty_texts():
    sig = signatures(["", " \n\t", "가", "가 나", "가나", "가나다라", "가나다라마"], **PARAMS)
    assert np.array_equal(sig[0], sig[1])  # both compact to ''
    assert np.array_equal(sig[3], sig[4])  # both compact to '가나'
    # one shingle each, all different: '' and '가나다라' (padded) and '가나다라마' (one 5-gram)
    for i, j in [(0, 2), (2, 4), (4, 5), (5, 6), (0, 6)]:
        assert estimate(sig[i], sig[j]) == 0
    assert signatures([], **PARAMS).shape == (0, 128)


@pytest.mark.parametrize("num_perm", [64, 112, 128, 256])
def test_num_perm_values(num_perm):
    rng = random.Random(num_perm)
    base = hangul(rng, 400)
    near = base[:380] + hangul(rng, 20)
    far = hangul(rng, 400)
    sig = signatures([base, near, far, spaced(rng, base)], num_perm=num_perm, ngram=5, seed=3)
    assert sig.shape == (4, num_perm)
    j_near = len(shingle_set(base, 5) & shingle_set(near, 5)) / len(
        shingle_set(base, 5) | shingle_set(near, 5)
    )
    assert abs(estimate(sig[0], sig[1]) - j_near) < 5 * np.sqrt(j_near * (1 - j_near) / num_perm)
    assert estimate(sig[0], sig[2]) < 0.05
    assert np.array_equal(sig[0], sig[3])


def test_bad_parameters():
    with pytest.raises(ValueError, match="num_perm"):
        signatures(["가"], num_perm=0, ngram=5, seed=0)
    with pytest.raises(ValueError, match="ngram"):
        signatures(["가"], num_perm=8, ngram=0, seed=0)


# ---------------------------------------------------------------------------------------------
# The estimator


def pair_with_jaccard(rng: random.Random, length: int, target: float, n: int) -> tuple[str, str]:
    """Two Hangul texts of `length` syllables sharing a prefix sized for shingle Jaccard ~target."""
    if target >= 1:
        text = hangul(rng, length)
        return text, spaced(rng, text)
    per_text = length - n + 1
    shared = round(2 * target * per_text / (1 + target))  # J = I / (2m - I)
    prefix = hangul(rng, shared + n - 1) if shared else ""
    return prefix + hangul(rng, length - len(prefix)), prefix + hangul(rng, length - len(prefix))


@pytest.mark.parametrize(
    ("length", "pairs", "num_perm"),
    [(30, 300, 128), (30, 300, 64), (200, 300, 128), (1000, 150, 256), (50_000, 12, 128)],
)
def test_jaccard_estimate_is_unbiased_with_binomial_spread(length, pairs, num_perm):
    """Mean error within 0.02 (per target J where there are enough pairs to tell, else pooled
    over the J values); spread within 1.3x the binomial (likewise, as pooled z-scores)."""
    n = 5
    rng = random.Random(length * 1000 + num_perm)
    z_scores, errors = [], []
    for target in (0.0, 0.3, 0.5, 0.8, 0.9, 1.0):
        firsts, seconds, exact = [], [], []
        for _ in range(pairs):
            a, b = pair_with_jaccard(rng, length, target, n)
            sa, sb = shingle_set(a, n), shingle_set(b, n)
            firsts.append(a)
            seconds.append(b)
            exact.append(len(sa & sb) / len(sa | sb))
        exact = np.array(exact)
        est = estimate(
            signatures(firsts, num_perm=num_perm, ngram=n, seed=11),
            signatures(seconds, num_perm=num_perm, ngram=n, seed=11),
        )
        error = est - exact
        errors.append(error)
        if pairs >= 100:
            assert abs(error.mean()) <= 0.02, (target, error.mean())
        if target in (0.0, 1.0):
            assert np.all(est == target)
            continue
        assert abs(exact.mean() - target) < 0.03
        binomial = np.sqrt(exact * (1 - exact) / num_perm)
        z_scores.append(error / binomial)
        if pairs >= 100:
            assert 0.5 <= error.std() / binomial.mean() <= 1.3, (target, error.std(), binomial)
    assert abs(np.concatenate(errors).mean()) <= 0.02
    z = np.concatenate(z_scores)
    assert 0.5 <= z.std() <= 1.3, z.std()


def test_nfc_korean_near_duplicates():
    text = unicodedata.normalize(
        "NFC",
        "대한민국은 동아시아의 한반도 남부에 위치한 민주공화국이다. 수도는 서울특별시이며, "
        "국기는 태극기, 국가는 애국가, 공용어는 한국어이다.",
    )
    respaced = text.replace(" ", "").replace("이다.", "이다. ")
    edited = text.replace("서울특별시", "서울")
    decomposed = unicodedata.normalize("NFD", text)  # the caller normalises: NFD differs
    sig = signatures([text, respaced, edited, decomposed], **PARAMS)
    assert np.array_equal(sig[0], sig[1])
    assert 0.6 < estimate(sig[0], sig[2]) < 1
    assert estimate(sig[0], sig[3]) < 0.1


# ---------------------------------------------------------------------------------------------
# Exact hashes


def test_content_hashes():
    texts = ["가나다", "가나다 ", "가나다", "", "가나다\n", "ab"]
    h = content_hashes(texts)
    assert h.shape == (6, 4) and h.dtype == np.uint32
    assert np.array_equal(h[0], h[2])
    rows = {tuple(r) for r in h.tolist()}
    assert len(rows) == 5
    digest = hashlib.blake2b("가나다".encode(), digest_size=16).digest()
    assert h[0].astype("<u4").tobytes() == digest
    assert content_hashes([]).shape == (0, 4)
