"""Personal data in web text replaced, not the documents dropped: e-mail addresses, IP addresses
(v4 and v6), Korean mobile and landline telephone numbers, and resident registration numbers.

FineWeb anonymises e-mails and IPv4 addresses with datatrove's PIIFormatter; hanlm takes its
e-mail pattern and its test of a public address, adds IPv6 and the Korean numbers, and replaces
each kind with one fixed string that is recognisably not anyone's (the documentation ranges of
RFC 5737 and RFC 3849, example.com, zeros), so the model learns the shape of a contact line and
no one's contact. Each replacement is counted by kind.

What is left alone, on purpose: private and loopback IPs (not personal, as datatrove's default),
numbers without the separators a telephone number is written with (a bare 10-11 digit run is
as often an order or account number), dates (2024-01-15, 2024.01.15), prices, ISBNs, and
dotted version numbers after "v", "ver", "version" or "버전".
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from dataclasses import dataclass, field

from datatrove.pipeline.formatters.pii import PIIFormatter, public_ip_validator

REPLACEMENTS = {
    "email": "email@example.com",
    "ipv4": "192.0.2.1",  # RFC 5737 TEST-NET-1
    "ipv6": "2001:db8::1",  # RFC 3849 documentation prefix
    "mobile": "010-0000-0000",
    "landline": "02-000-0000",
    "resident_number": "000000-0000000",
}
EXAMPLES_PER_KIND = 3
_CONTEXT = 24  # characters either side of a replacement in an example

_NOT_AFTER_DIGIT = r"(?<![\w.+-])"  # a number starts here, not inside another
_NOT_BEFORE_DIGIT = r"(?![\w.-]?\d)"
_SEP = r"[-. ]"
_KOREA = r"(?:\+82[- ]?|0)"
# 010-1234-5678, 010 1234 5678, 010.1234.5678, +82 10-1234-5678 (the old 011/016-019 too)
_MOBILE = re.compile(
    _NOT_AFTER_DIGIT + _KOREA + r"1[016789]" + rf"(?:{_SEP}\d{{3,4}}{_SEP}|\)\s?\d{{3,4}}-)"
    r"\d{4}" + _NOT_BEFORE_DIGIT
)
# 02-123-4567, (02) 1234-5678, 031-123-4567, 070-1234-5678, +82 2-123-4567
_LANDLINE = re.compile(
    r"(?:" + _NOT_AFTER_DIGIT + _KOREA + r"(?:2|[3-6][1-5]|70)" + rf"{_SEP}\d{{3,4}}{_SEP}"
    r"|\(0(?:2|[3-6][1-5]|70)\)\s?\d{3,4}-)\d{4}" + _NOT_BEFORE_DIGIT
)
# 900101-1234567: a date of birth (YYMMDD), a hyphen, then 1-8 (century and sex) and 6 digits
_RESIDENT = re.compile(
    _NOT_AFTER_DIGIT
    + r"\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\s?-\s?[1-8]\d{6}"
    + _NOT_BEFORE_DIGIT
)
_IPV4 = re.compile(
    r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)(?![\w.]?\d)"
)
# candidates (hex groups with colons, one :: at most); ipaddress decides what is an address
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
# one pass for every kind written with digits: its group names the kind
_DIGIT_KINDS = {"resident_number": _RESIDENT, "mobile": _MOBILE, "landline": _LANDLINE,
                "ipv4": _IPV4}  # fmt: skip
# every kind starts with a digit, + or (: the lookahead fails other places at once (4x faster)
_NUMBERS = re.compile(
    r"(?=[\d+(])(?:" + "|".join(f"(?P<{k}>{p.pattern})" for k, p in _DIGIT_KINDS.items()) + ")"
)
# every one of them has two digit groups split by a separator (most text has no such place)
_DIGITS_SPLIT = re.compile(r"\d\s?[-. )]\s?\d")
_VERSION_BEFORE = re.compile(r"(?:\b[vV]|\bver\.?|\bversion|버전)\s*$")


@dataclass
class Scrubbed:
    """What a scrubber replaced: counts by kind, and a few examples (the scrubbed text around
    a replacement: an example never holds what was replaced)."""

    counts: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)


class PiiScrubber:
    def __init__(self) -> None:
        # datatrove's e-mail pattern (FineWeb's), used through its formatter's replacer
        self._email = PIIFormatter().emails_replacer.regex
        self.seen = Scrubbed()

    def scrub(self, text: str) -> str:
        """`text` with every kind replaced; counts and examples go to `self.seen`."""
        replaced: Counter = Counter()
        if "@" in text:
            text = self._email.sub(lambda m: self._count("email", replaced), text)
        if _DIGITS_SPLIT.search(text):
            text = _NUMBERS.sub(lambda m: self._number(m, replaced), text)
        if "::" in text or text.count(":") >= 3:
            text = _IPV6.sub(lambda m: self._ipv6(m, replaced), text)
        if replaced:
            self.seen.counts.update(replaced)
            for kind in replaced:  # examples from the text every kind was replaced in
                self._examples(kind, text)
        return text

    @staticmethod
    def _count(kind: str, replaced: Counter) -> str:
        replaced[kind] += 1
        return REPLACEMENTS[kind]

    def _number(self, match: re.Match, replaced: Counter) -> str:
        kind = match.lastgroup
        if kind == "ipv4" and not _is_public_ipv4(match, match.string):
            return match.group(0)
        return self._count(kind, replaced)

    def _ipv6(self, match: re.Match, replaced: Counter) -> str:
        if not _is_public_ipv6(match, match.string):
            return match.group(0)
        return self._count("ipv6", replaced)

    def _examples(self, kind: str, text: str) -> None:
        examples = self.seen.examples.setdefault(kind, [])
        replacement, start = REPLACEMENTS[kind], 0
        while len(examples) < EXAMPLES_PER_KIND:
            start = text.find(replacement, start)
            if start < 0:
                return
            end = start + len(replacement)
            examples.append(text[max(0, start - _CONTEXT) : end + _CONTEXT])
            start = end


def _is_public_ipv4(match: re.Match, text: str) -> bool:
    if _VERSION_BEFORE.search(text[max(0, match.start() - 12) : match.start()]):
        return False  # v1.2.3.4, 버전 4.2.0.1: a version number
    return public_ip_validator(match.group(0))


def _is_public_ipv6(match: re.Match, text: str) -> bool:
    candidate = match.group(0)
    if candidate.count(":") < 2 or not any(c.isalnum() for c in candidate):
        return False  # "::", times like 12:30:45 fail below
    try:
        address = ipaddress.IPv6Address(candidate)
    except ValueError:
        return False
    return address.is_global
