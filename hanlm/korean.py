"""Korean particles (josa): the right form of 은/는, 이/가, 을/를 ... after a word.

The demo world's templates and the direction probe both write sentences with them.
"""

from __future__ import annotations

import re
import unicodedata

# pair -> (form after a final consonant, form after a vowel). The first six are the public API;
# the rest are forms the demo world's templates need (hanlm/demo/templates).
_PARTICLES = {
    "은/는": ("은", "는"),
    "이/가": ("이", "가"),
    "을/를": ("을", "를"),
    "과/와": ("과", "와"),
    "으로/로": ("으로", "로"),
    "이다/다": ("이다", "다"),
    "이에요/예요": ("이에요", "예요"),
    "이라는/라는": ("이라는", "라는"),
    "이라고/라고": ("이라고", "라고"),
}

_HANGUL_FIRST, _HANGUL_COUNT = 0xAC00, 11172
_RIEUL_FINAL = 8  # index of ㄹ among the 28 final-consonant slots (0 = none)

# How the last digit of a number is read aloud: 영 일 이 삼 사 오 육 칠 팔 구.
_DIGIT_SOUND = {
    "0": "other",
    "1": "rieul",
    "2": "none",
    "3": "other",
    "4": "none",
    "5": "none",
    "6": "other",
    "7": "rieul",
    "8": "rieul",
    "9": "none",
}


def _number_sound(digits: str) -> str:
    """The final sound of a number read in Korean: 3 is 삼, 20 is 이십, 10000 is 만."""
    significant = digits.rstrip("0")
    if not significant:
        return "other"  # 영
    zeros = len(digits) - len(significant)
    if zeros == 0:
        return _DIGIT_SOUND[significant[-1]]
    # The number ends in a place word: 십, 백, 천, then 만, 억 (all with a final consonant) and 조.
    return "none" if 12 <= zeros < 16 else "other"


def _final_sound(word: str) -> str:
    """'none', 'rieul' (ㄹ) or 'other': how the word's last pronounced syllable ends."""
    end = len(word)
    # Closing quotes, brackets, full stops and spaces are not read: look past them.
    while end and unicodedata.category(word[end - 1])[0] in "PZ":
        end -= 1
    if not end:
        return "none"
    char = word[end - 1]
    index = ord(char) - _HANGUL_FIRST
    if 0 <= index < _HANGUL_COUNT:
        final = index % 28
        if final == 0:
            return "none"
        return "rieul" if final == _RIEUL_FINAL else "other"
    if char.isascii() and char.isdigit():
        digits = re.search(r"[\d,]*$", word[:end]).group().replace(",", "")
        return _number_sound(digits)
    if char.isascii() and char.isalpha():
        # Latin letters as read in Korean: 엘 and 알 end in ㄹ, 엠 and 엔 in a consonant.
        upper = char.upper()
        if upper in "LR":
            return "rieul"
        return "other" if upper in "MN" else "none"
    return "none"  # anything else: assume a vowel ending, the more common case for loanwords


def josa(word: str, pair: str) -> str:
    """`word` followed by the right form of a particle, e.g. josa("서울", "은/는") == "서울은".

    `pair` names both forms, the one after a final consonant first: "은/는", "이/가", "을/를",
    "과/와", "으로/로", "이다/다". A word ending in ㄹ takes 로, like one ending in a vowel.
    """
    try:
        after_consonant, after_vowel = _PARTICLES[pair]
    except KeyError:
        raise ValueError(f"unknown particle pair {pair!r}; use one of {list(_PARTICLES)}") from None
    sound = _final_sound(word)
    if pair == "으로/로":
        return word + (after_consonant if sound == "other" else after_vowel)
    return word + (after_vowel if sound == "none" else after_consonant)
