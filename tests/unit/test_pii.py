"""The PII scrubber on Korean web text: each kind of personal data replaced by its fixed string
and counted, and the look-alikes that must survive (dates, prices, ISBNs, versions, private
addresses, times, bare digit runs) left as they are."""

import pytest

from hanlm.data.pii import REPLACEMENTS, PiiScrubber

# (text, the kind replaced, what the text must become)
REPLACED = [
    (
        "문의: hong.gildong@example.co.kr 로 보내 주세요",
        "email",
        "문의: email@example.com 로 보내 주세요",
    ),
    ("메일 kim_01+news@naver.com입니다", "email", "메일 email@example.com입니다"),
    ("휴대폰 010-1234-5678 으로 연락", "mobile", "휴대폰 010-0000-0000 으로 연락"),
    ("전화 010 1234 5678", "mobile", "전화 010-0000-0000"),
    ("연락처:010.123.4567", "mobile", "연락처:010-0000-0000"),
    ("국제 +82 10-9876-5432 번호", "mobile", "국제 010-0000-0000 번호"),
    ("예전 번호 011-234-5678", "mobile", "예전 번호 010-0000-0000"),
    ("대표번호 02-123-4567", "landline", "대표번호 02-000-0000"),
    ("사무실 (02) 1234-5678", "landline", "사무실 02-000-0000"),
    ("경기 031-987-6543 문의", "landline", "경기 02-000-0000 문의"),
    ("인터넷전화 070-1234-5678", "landline", "인터넷전화 02-000-0000"),
    ("주민등록번호 900101-1234567 기재", "resident_number", "주민등록번호 000000-0000000 기재"),
    ("생년 851231 - 2345678", "resident_number", "생년 000000-0000000"),
    ("서버 주소 211.234.10.5 에 접속", "ipv4", "서버 주소 192.0.2.1 에 접속"),
    ("IP:8.8.8.8,", "ipv4", "IP:192.0.2.1,"),
    ("v6 주소 2606:4700:4700::1111 사용", "ipv6", "v6 주소 2001:db8::1 사용"),
]

# text that looks like one of them and must come out unchanged
KEPT = [
    "2024-01-15 에 발표",
    "2024.01.15. 기준",
    "가격은 1,234,567원입니다",
    "ISBN 978-89-1234-567-8",
    "ISBN 89-7283-123-4",
    "버전 4.2.0.1 업데이트",
    "v1.2.3.4 릴리스",
    "공유기 192.168.0.1 설정",
    "localhost 127.0.0.1",
    "오후 12:30:45 시작",
    "주문번호 01012345678",  # no separators: an order number as often as a phone
    "2010-2015년 통계",
    "계좌 110-234-567890",
    "우편번호 06236",
    "1588-1234 고객센터",  # a business's public number, not a person's
    "비율 3.14:2.71",
    "면적 123456-7890123 제곱미터",  # not a date of birth (month 34)
]


@pytest.mark.parametrize(("text", "kind", "expected"), REPLACED)
def test_personal_data_is_replaced_and_counted(text, kind, expected):
    scrubber = PiiScrubber()
    assert scrubber.scrub(text) == expected
    assert scrubber.seen.counts == {kind: 1}
    [example] = scrubber.seen.examples[kind]
    assert REPLACEMENTS[kind] in example and example in expected  # never the original


@pytest.mark.parametrize("text", KEPT)
def test_look_alikes_survive(text):
    scrubber = PiiScrubber()
    assert scrubber.scrub(text) == text
    assert not scrubber.seen.counts


def test_examples_are_capped_and_counts_add_up():
    scrubber = PiiScrubber()
    text = " ".join(f"010-1234-56{i:02d}" for i in range(10))
    assert scrubber.scrub(text) == " ".join(["010-0000-0000"] * 10)
    assert scrubber.seen.counts["mobile"] == 10
    assert len(scrubber.seen.examples["mobile"]) == 3
