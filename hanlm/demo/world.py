"""The demo world: a small, deterministic, synthetic Korean world for the built-in demo pipeline.

One seed gives everything the later stages need to run end to end without downloading data:

* pretraining documents: encyclopedia paragraphs about real countries, arithmetic word problems
  with worked answers (`#### N`), and everyday writing (diaries, letters, short essays, recipes);
* a yes/no reading benchmark, a recorded part of which is planted into the documents in one of
  four styles, so decontamination has real leaks to find and real non-leaks to leave alone;
* chat conversations for SFT (kept out of the pretraining documents);
* the table of capital facts behind it all.

Capitals are only ever stated country first ("A의 수도는 B이다"); no text anywhere says "B는 A의
수도이다". A later probe can then honestly ask whether a model learned the reverse direction.

Stdlib only and cheap to import: corpus workers and tests import it without paying for torch.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hanlm.files import atomic_write_text
from hanlm.korean import josa
from hanlm.testsets.readers import item_text

PLANT_STYLES = ("verbatim", "spacing", "punctuation", "embedded")


@dataclass(frozen=True)
class Fact:
    """One row of the facts table, e.g. Fact("프랑스", "capital", "파리", "유럽")."""

    subject: str
    relation: str
    object: str
    continent: str


@dataclass
class DemoWorld:
    """Everything `build` makes; `write` puts it on disk."""

    documents: list[dict]
    benchmark: list[dict]
    conversations: list[dict]
    facts: list[Fact]
    # One {"item_id", "plant_style", "document_id"} per planted benchmark item (planted.json).
    planted: list[dict] = field(default_factory=list)


# --- facts -----------------------------------------------------------------------------------

# (country, capital, continent). Left out on purpose: countries whose capital is disputed or in
# transition, and names that collide with other names or everyday words (알제 inside 알제리,
# 다카 inside 다카르, 리가 inside 우리가, 빈, 수단, 가나, 오만), so plain substring checks stay honest.
_CAPITALS = (
    ("대한민국", "서울", "아시아"),
    ("일본", "도쿄", "아시아"),
    ("중국", "베이징", "아시아"),
    ("몽골", "울란바토르", "아시아"),
    ("베트남", "하노이", "아시아"),
    ("태국", "방콕", "아시아"),
    ("필리핀", "마닐라", "아시아"),
    ("말레이시아", "쿠알라룸푸르", "아시아"),
    ("라오스", "비엔티안", "아시아"),
    ("캄보디아", "프놈펜", "아시아"),
    ("미얀마", "네피도", "아시아"),
    ("인도", "뉴델리", "아시아"),
    ("파키스탄", "이슬라마바드", "아시아"),
    ("네팔", "카트만두", "아시아"),
    ("부탄", "팀푸", "아시아"),
    ("아프가니스탄", "카불", "아시아"),
    ("이란", "테헤란", "아시아"),
    ("이라크", "바그다드", "아시아"),
    ("사우디아라비아", "리야드", "아시아"),
    ("요르단", "암만", "아시아"),
    ("시리아", "다마스쿠스", "아시아"),
    ("레바논", "베이루트", "아시아"),
    ("카타르", "도하", "아시아"),
    ("아랍에미리트", "아부다비", "아시아"),
    ("카자흐스탄", "아스타나", "아시아"),
    ("우즈베키스탄", "타슈켄트", "아시아"),
    ("튀르키예", "앙카라", "아시아"),
    ("프랑스", "파리", "유럽"),
    ("독일", "베를린", "유럽"),
    ("영국", "런던", "유럽"),
    ("이탈리아", "로마", "유럽"),
    ("스페인", "마드리드", "유럽"),
    ("포르투갈", "리스본", "유럽"),
    ("네덜란드", "암스테르담", "유럽"),
    ("벨기에", "브뤼셀", "유럽"),
    ("스위스", "베른", "유럽"),
    ("폴란드", "바르샤바", "유럽"),
    ("체코", "프라하", "유럽"),
    ("헝가리", "부다페스트", "유럽"),
    ("그리스", "아테네", "유럽"),
    ("스웨덴", "스톡홀름", "유럽"),
    ("노르웨이", "오슬로", "유럽"),
    ("덴마크", "코펜하겐", "유럽"),
    ("핀란드", "헬싱키", "유럽"),
    ("아일랜드", "더블린", "유럽"),
    ("아이슬란드", "레이캬비크", "유럽"),
    ("러시아", "모스크바", "유럽"),
    ("우크라이나", "키이우", "유럽"),
    ("루마니아", "부쿠레슈티", "유럽"),
    ("불가리아", "소피아", "유럽"),
    ("크로아티아", "자그레브", "유럽"),
    ("세르비아", "베오그라드", "유럽"),
    ("슬로바키아", "브라티슬라바", "유럽"),
    ("슬로베니아", "류블랴나", "유럽"),
    ("에스토니아", "탈린", "유럽"),
    ("리투아니아", "빌뉴스", "유럽"),
    ("이집트", "카이로", "아프리카"),
    ("나이지리아", "아부자", "아프리카"),
    ("케냐", "나이로비", "아프리카"),
    ("에티오피아", "아디스아바바", "아프리카"),
    ("모로코", "라바트", "아프리카"),
    ("튀니지", "튀니스", "아프리카"),
    ("세네갈", "다카르", "아프리카"),
    ("탄자니아", "도도마", "아프리카"),
    ("우간다", "캄팔라", "아프리카"),
    ("르완다", "키갈리", "아프리카"),
    ("잠비아", "루사카", "아프리카"),
    ("짐바브웨", "하라레", "아프리카"),
    ("앙골라", "루안다", "아프리카"),
    ("마다가스카르", "안타나나리보", "아프리카"),
    ("카메룬", "야운데", "아프리카"),
    ("미국", "워싱턴 D.C.", "북아메리카"),
    ("캐나다", "오타와", "북아메리카"),
    ("쿠바", "아바나", "북아메리카"),
    ("자메이카", "킹스턴", "북아메리카"),
    ("코스타리카", "산호세", "북아메리카"),
    ("브라질", "브라질리아", "남아메리카"),
    ("아르헨티나", "부에노스아이레스", "남아메리카"),
    ("칠레", "산티아고", "남아메리카"),
    ("페루", "리마", "남아메리카"),
    ("콜롬비아", "보고타", "남아메리카"),
    ("베네수엘라", "카라카스", "남아메리카"),
    ("에콰도르", "키토", "남아메리카"),
    ("우루과이", "몬테비데오", "남아메리카"),
    ("파라과이", "아순시온", "남아메리카"),
    ("오스트레일리아", "캔버라", "오세아니아"),
    ("뉴질랜드", "웰링턴", "오세아니아"),
    ("피지", "수바", "오세아니아"),
    ("파푸아뉴기니", "포트모르즈비", "오세아니아"),
)

FACTS: tuple[Fact, ...] = tuple(
    Fact(country, "capital", capital, continent) for country, capital, continent in _CAPITALS
)


_SLOT = re.compile(r"\{(\w+)(?::([^{}]+))?\}")


def _fill(template: str, **values: object) -> str:
    """Fill `{name}` and `{name:은/는}` slots; the second form attaches the right particle."""

    def replace(match: re.Match) -> str:
        word = str(values[match.group(1)])
        pair = match.group(2)
        return josa(word, pair) if pair else word

    return _SLOT.sub(replace, template)


def _fill_all(templates: Iterable[str], **values: object) -> str:
    return " ".join(_fill(t, **values) for t in templates)


# --- shared vocabulary -----------------------------------------------------------------------

_NAMES = (
    "민수", "지현", "서연", "하준", "도윤", "서윤", "지우", "예준", "수아", "하은",
    "시우", "지호", "유나", "민준", "채원", "준서", "소윤", "은우", "지안", "현우",
    "다은", "승민", "예린", "태윤", "가은", "정우", "나연", "건우", "수빈", "영호",
)  # fmt: skip
_WEEKDAYS = ("월요일", "화요일", "수요일", "목요일", "금요일", "토요일", "일요일")
_SEASONS = ("봄", "여름", "가을", "겨울")
_CONTINENTS = ("아시아", "유럽", "아프리카", "북아메리카", "남아메리카", "오세아니아")


@dataclass(frozen=True)
class _Atlas:
    """The facts, grouped the way the encyclopedia templates use them."""

    facts: tuple[Fact, ...]
    by_continent: dict[str, tuple[Fact, ...]]

    @classmethod
    def of(cls, facts: Sequence[Fact]) -> _Atlas:
        groups = {c: tuple(f for f in facts if f.continent == c) for c in _CONTINENTS}
        return cls(tuple(facts), groups)

    def neighbours(self, fact: Fact) -> tuple[Fact, ...]:
        return tuple(f for f in self.by_continent[fact.continent] if f != fact)


# --- encyclopedia ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Register:
    """Sentence templates of one writing register, by role in a paragraph about a country."""

    intro: tuple[str, ...]
    capital: tuple[str, ...]
    continent: tuple[str, ...]
    filler: tuple[str, ...]


# Every template that names a capital names its country earlier in the same sentence.
_PLAIN = _Register(
    intro=(
        "{country:은/는} {continent}에 있는 나라이다.",
        "{country:은/는} {continent}에 위치한 국가이다.",
        "{country:은/는} {continent}에 자리한 나라로, 고유한 역사와 문화를 지니고 있다.",
        "{country:은/는} {continent}의 여러 나라 가운데 하나이다.",
        "{country:은/는} {continent} 대륙에 속한 주권 국가이다.",
    ),
    capital=(
        "{country}의 수도는 {capital:이다/다}.",
        "{country}의 수도는 {capital}이다.",
        "{country}의 수도는 {capital:으로/로}, 이 나라를 소개할 때 빠지지 않는 도시이다.",
        "{country}에서 수도 역할을 하는 도시는 {capital:이다/다}.",
        "{country}에 관해 먼저 알아 둘 사실 하나는 수도가 {capital:이라는/라는} 점이다.",
        "{country}의 수도 이름은 {capital}이다.",
        "지도에서 {country:을/를} 찾아보면 수도 {capital}도 함께 표시되어 있다.",
        "{country:을/를} 여행한다면 수도 {capital:을/를} 둘러보는 것도 좋은 방법이다.",
        "{country}의 수도 {capital}에는 여러 공공 기관과 문화 시설이 있다.",
        "{country}의 수도는 {capital}이며, 해마다 많은 방문객이 이 도시를 찾는다.",
    ),
    continent=(
        "지리적으로 {country:은/는} {continent}에 포함된다.",
        "{continent}에는 {country} 말고도 {others} 같은 나라가 있다.",
        "같은 {continent}의 나라로는 {more_others} 등을 들 수 있다.",
        "{country:과/와} 같은 대륙에 있는 {other}의 수도는 {other_capital:이다/다}.",
        "{country:과/와} {other:은/는} 모두 {continent}에 있는 나라이다.",
        "{country:과/와} {other}의 수도는 각각 {capital:과/와} {other_capital}이다.",
    ),
    filler=(
        "{country}의 날씨는 지역과 계절에 따라 차이가 있다.",
        "{country}에는 오래전부터 전해 내려온 음식과 풍습이 있다.",
        "{country} 사람들은 저마다의 방식으로 명절과 기념일을 보낸다.",
        "{country}의 학교에서는 자기 나라의 역사와 지리를 가르친다.",
        "{country:을/를} 더 잘 이해하려면 그 나라의 역사와 언어를 함께 살펴보는 것이 좋다.",
        "{country}의 도시와 시골은 생활 모습이 서로 조금씩 다르다.",
        "{country}에 관한 자료는 도서관이나 박물관에서도 찾아볼 수 있다.",
        "많은 여행자가 {country}의 자연 경관과 도시 풍경에 관심을 보인다.",
        "{country}의 역사는 주변 지역과의 교류 속에서 만들어져 왔다.",
        "{country}에서는 지역마다 즐겨 먹는 음식이 조금씩 다르다.",
    ),
)

_POLITE = _Register(
    intro=(
        "{country:은/는} {continent}에 있는 나라입니다.",
        "{country:은/는} {continent}에 자리한 나라입니다.",
        "오늘 알아볼 나라는 {continent}에 있는 {country}입니다.",
    ),
    capital=(
        "{country}의 수도는 {capital}입니다.",
        "{country}의 수도는 {capital:이라고/라고} 해요.",
        "{country}에서 꼭 기억해 둘 도시는 수도인 {capital}입니다.",
        "{country:을/를} 여행한다면 수도 {capital}에도 들러 보세요.",
        "{country}의 수도 이름은 {capital}입니다.",
    ),
    continent=(
        "{country:은/는} {continent}에 속합니다.",
        "{continent}에는 {country} 말고도 {others} 같은 나라가 있습니다.",
        "{country:과/와} {other}의 수도는 각각 {capital:과/와} {other_capital}입니다.",
    ),
    filler=(
        "{country}의 날씨는 지역과 계절에 따라 다릅니다.",
        "{country}에는 오래전부터 전해 내려온 음식과 풍습이 있습니다.",
        "{country}의 역사와 문화를 알아 가는 것은 즐거운 일입니다.",
        "{country} 사람들도 명절과 기념일을 소중히 여깁니다.",
        "궁금한 점이 있다면 도서관에서 {country}에 관한 책을 찾아보세요.",
    ),
)


def _country_slots(rng: random.Random, atlas: _Atlas, fact: Fact) -> dict[str, str]:
    neighbours = atlas.neighbours(fact)

    def some_neighbours() -> str:
        picked = rng.sample(neighbours, k=min(len(neighbours), rng.randint(2, 4)))
        return ", ".join(f.subject for f in picked)

    other = rng.choice(neighbours)
    return {
        "country": fact.subject,
        "capital": fact.object,
        "continent": fact.continent,
        "others": some_neighbours(),
        "more_others": some_neighbours(),
        "other": other.subject,
        "other_capital": other.object,
    }


def _country_paragraph(
    rng: random.Random, register: _Register, slots: dict[str, str], *, with_capital: bool = True
) -> str:
    """One paragraph in shuffled order, so a small model cannot learn a single fixed template."""
    body = [rng.choice(register.capital)] if with_capital else []
    body += rng.sample(register.continent, k=rng.randint(0, 2))
    body += rng.sample(register.filler, k=rng.randint(2, 3))
    rng.shuffle(body)
    if rng.random() < 0.8:
        body.insert(0, rng.choice(register.intro))
    return _fill_all(body, **slots)


def _encyclopedia_entry(rng: random.Random, atlas: _Atlas) -> str:
    fact = rng.choice(atlas.facts)
    slots = _country_slots(rng, atlas, fact)
    register = _PLAIN if rng.random() < 0.75 else _POLITE
    paragraphs = [_country_paragraph(rng, register, slots)]
    if rng.random() < 0.35:
        with_capital = rng.random() < 0.5
        paragraphs.append(_country_paragraph(rng, register, slots, with_capital=with_capital))
    title = rng.choice(("{country}", "== {country} ==", "{country} ({continent})", ""))
    if title:
        paragraphs.insert(0, _fill(title, **slots))
    return "\n\n".join(paragraphs) if rng.random() < 0.5 else "\n".join(paragraphs)


_LIST_TITLES = (
    "세계 여러 나라의 수도",
    "알아 두면 좋은 세계 수도 상식",
    "나라별 수도 정리",
    "{continent} 나라들의 수도",
    "{continent}의 나라와 수도",
)
_LIST_LINES = (
    "{country}의 수도는 {capital:이다/다}.",
    "{country}의 수도는 {capital}입니다.",
    "{country}의 수도: {capital}",
    "{country} - 수도 {capital}",
)


def _capital_list(rng: random.Random, atlas: _Atlas) -> str:
    title = rng.choice(_LIST_TITLES)
    continent = rng.choice(_CONTINENTS)
    pool = atlas.by_continent[continent] if "{continent}" in title else atlas.facts
    chosen = rng.sample(pool, k=min(len(pool), rng.randint(6, 15)))
    line = rng.choice(_LIST_LINES)
    numbered = rng.random() < 0.5
    lines = [_fill(title, continent=continent)]
    for number, fact in enumerate(chosen, start=1):
        bullet = f"{number}. " if numbered else "- "
        lines.append(bullet + _fill(line, country=fact.subject, capital=fact.object))
    return "\n".join(lines)


def _capital_comparison(rng: random.Random, atlas: _Atlas) -> str:
    first, second = rng.sample(atlas.facts, k=2)
    slots = {
        "a": first.subject,
        "a_capital": first.object,
        "a_continent": first.continent,
        "b": second.subject,
        "b_capital": second.object,
        "b_continent": second.continent,
    }
    sentences = [
        "{a:과/와} {b}의 수도는 각각 {a_capital:과/와} {b_capital}이다.",
        "두 나라는 모두 {a_continent}에 있다."
        if first.continent == second.continent
        else rng.choice(
            (
                "{a:은/는} {a_continent}에, {b:은/는} {b_continent}에 있다.",
                "{a:은/는} {a_continent}의 나라이고, {b:은/는} {b_continent}의 나라이다.",
            )
        ),
        rng.choice(
            (
                "두 나라는 기후와 생활 방식에서 서로 다른 점이 많다.",
                "두 나라의 수도를 함께 외워 두면 세계 지리를 공부할 때 도움이 된다.",
                "두 나라를 비교해 보면 세계가 얼마나 다양한지 알 수 있다.",
            )
        ),
    ]
    return _fill_all(sentences, **slots)


def _continent_overview(rng: random.Random, atlas: _Atlas) -> str:
    """A long document: several paragraphs, one per country of a continent."""
    continent = rng.choice(_CONTINENTS)
    members = list(atlas.by_continent[continent])
    chosen = rng.sample(members, k=min(len(members), rng.randint(5, 10)))
    opening = _fill(
        "{continent}에는 여러 나라가 있으며, 나라마다 자연환경과 생활 모습이 다르다. "
        "이 글에서는 그중 몇 나라를 차례로 살펴본다.",
        continent=continent,
    )
    paragraphs = [f"{continent}의 나라들", opening]
    for fact in chosen:
        paragraphs.append(_country_paragraph(rng, _PLAIN, _country_slots(rng, atlas, fact)))
    return "\n\n".join(paragraphs)


# --- arithmetic word problems ----------------------------------------------------------------


@dataclass(frozen=True)
class _Problem:
    """A word problem; every step shows its arithmetic as `a op b = c` so it can be checked."""

    question: str
    steps: tuple[str, ...]
    answer: int

    def solution(self) -> str:
        return "\n".join(self.steps) + f"\n#### {self.answer}"


# (item, counter, shop, lowest price, highest price): prices in won, multiples of 100.
_PRICED_ITEMS = (
    ("연필", "자루", "문구점", 300, 900),
    ("공책", "권", "문구점", 500, 2000),
    ("지우개", "개", "문구점", 200, 800),
    ("사과", "개", "과일 가게", 500, 1500),
    ("빵", "개", "빵집", 1000, 3000),
    ("아이스크림", "개", "편의점", 500, 2000),
    ("장미", "송이", "꽃집", 1000, 3000),
    ("우유", "팩", "마트", 800, 2000),
)
_SNACKS = ("사과", "귤", "사탕", "쿠키", "초콜릿", "딸기")


def _price(rng: random.Random, low: int, high: int) -> int:
    return rng.randrange(low, high + 1, 100)


def _total_price_problem(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    item, counter, shop, low, high = rng.choice(_PRICED_ITEMS)
    price, count = _price(rng, low, high), rng.randint(2, 9)
    total = price * count
    slots = {"name": name, "item": item, "counter": counter, "shop": shop}
    question = _fill(
        "{name:은/는} {shop}에서 한 {counter}에 {price}원인 {item:을/를} {count}{counter} "
        "샀습니다. 모두 얼마를 내야 할까요?",
        price=price,
        count=count,
        **slots,
    )
    steps = (
        _fill("{item} 한 {counter}의 값은 {price}원입니다.", price=price, **slots),
        _fill("{count}{counter:을/를} 샀으므로", count=count, **slots)
        + f" {price} × {count} = {total}원을 내야 합니다.",
    )
    return _Problem(question, steps, total)


def _change_problem(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    item, counter, _, low, high = rng.choice(_PRICED_ITEMS)
    price, count = _price(rng, low, high), rng.randint(2, 6)
    total = price * count
    money = (total // 1000 + 1) * 1000 + rng.choice((0, 1000, 2000, 5000))
    change = money - total
    question = _fill(
        "{name:은/는} {money}원을 가지고 가게에 가서 {price}원짜리 {item:을/를} {count}{counter} "
        "샀습니다. 남은 돈은 얼마일까요?",
        name=name,
        money=money,
        price=price,
        item=item,
        count=count,
        counter=counter,
    )
    steps = (
        f"먼저 {item} 값을 구하면 {price} × {count} = {total}원입니다.",
        f"가지고 있던 돈에서 빼면 {money} - {total} = {change}원이 남습니다.",
    )
    return _Problem(question, steps, change)


def _sharing_problem(rng: random.Random) -> _Problem:
    snack = rng.choice(_SNACKS)
    people, each = rng.randint(2, 9), rng.randint(2, 12)
    total = people * each
    question = rng.choice(
        (
            f"{snack} {total}개를 {people}명이 똑같이 나누어 가지려고 합니다. "
            "한 사람이 몇 개씩 가질 수 있을까요?",
            f"{josa(snack, '이/가')} {total}개 있습니다. 친구 {people}명에게 똑같이 나누어 주면 "
            "한 명에게 몇 개씩 줄 수 있을까요?",
        )
    )
    steps = (
        f"{total}개를 {people}명에게 똑같이 나누므로 나눗셈을 합니다.",
        f"{total} ÷ {people} = {each}이므로 한 사람이 {each}개씩 가집니다.",
    )
    return _Problem(question, steps, each)


def _speed_distance_problem(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    vehicle, speed = rng.choice(
        (("자전거", rng.randint(10, 20)), ("자동차", rng.randint(5, 9) * 10))
    )
    hours = rng.randint(2, 5)
    distance = speed * hours
    question = _fill(
        "{name:은/는} 한 시간에 {speed}km를 가는 {vehicle:을/를} 타고 {hours}시간 동안 "
        "쉬지 않고 갔습니다. 모두 몇 km를 갔을까요?",
        name=name,
        speed=speed,
        vehicle=vehicle,
        hours=hours,
    )
    steps = (
        f"한 시간에 {speed}km씩 {hours}시간을 갔으므로 {speed} × {hours} = {distance}km입니다.",
    )
    return _Problem(question, steps, distance)


def _route_problem(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    to_school, to_library = rng.randint(15, 90) * 10, rng.randint(15, 90) * 10
    total = to_school + to_library
    question = _fill(
        "집에서 학교까지는 {a}m이고, 학교에서 도서관까지는 {b}m입니다. {name:이/가} 집에서 "
        "학교를 거쳐 도서관까지 걸어가면 모두 몇 m를 걷게 될까요?",
        a=to_school,
        b=to_library,
        name=name,
    )
    steps = (
        "두 구간의 거리를 더하면 됩니다.",
        f"{to_school} + {to_library} = {total}m입니다.",
    )
    return _Problem(question, steps, total)


def _sibling_age_problem(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    age, gap, years = rng.randint(8, 15), rng.randint(1, 5), rng.randint(2, 10)
    sibling_now = age - gap
    sibling_later = sibling_now + years
    question = _fill(
        "{name:은/는} 올해 {age}살이고, 동생은 {name}보다 {gap}살 어립니다. "
        "{years}년 뒤에 동생은 몇 살이 될까요?",
        name=name,
        age=age,
        gap=gap,
        years=years,
    )
    steps = (
        f"동생의 올해 나이는 {age} - {gap} = {sibling_now}살입니다.",
        f"{years}년 뒤에는 {sibling_now} + {years} = {sibling_later}살이 됩니다.",
    )
    return _Problem(question, steps, sibling_later)


def _mother_age_problem(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    age = rng.randint(7, 12)
    times = rng.choice([t for t in (3, 4, 5) if 25 <= age * t <= 50])  # a plausible mother
    mother = age * times
    together = mother + age
    question = _fill(
        "{name:은/는} {age}살이고, 어머니의 나이는 {name}의 나이의 {times}배입니다. "
        "두 사람의 나이를 더하면 몇 살일까요?",
        name=name,
        age=age,
        times=times,
    )
    steps = (
        f"어머니의 나이는 {age} × {times} = {mother}살입니다.",
        f"두 사람의 나이를 더하면 {mother} + {age} = {together}살입니다.",
    )
    return _Problem(question, steps, together)


def _reading_days_problem(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    per_day, days = rng.choice((10, 12, 15, 20, 25, 30)), rng.randint(3, 12)
    pages = per_day * days
    question = _fill(
        "{name:은/는} {pages}쪽짜리 책을 하루에 {per_day}쪽씩 읽으려고 합니다. "
        "책을 다 읽으려면 며칠이 걸릴까요?",
        name=name,
        pages=pages,
        per_day=per_day,
    )
    steps = (f"{pages} ÷ {per_day} = {days}이므로 {days}일이 걸립니다.",)
    return _Problem(question, steps, days)


def _pages_left_problem(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    monday, tuesday = rng.randint(10, 60), rng.randint(10, 60)
    read = monday + tuesday
    pages = read + rng.randint(20, 200)
    left = pages - read
    question = _fill(
        "{name:이/가} 읽는 책은 모두 {pages}쪽입니다. 월요일에 {monday}쪽, 화요일에 {tuesday}쪽을 "
        "읽었다면 남은 쪽수는 몇 쪽일까요?",
        name=name,
        pages=pages,
        monday=monday,
        tuesday=tuesday,
    )
    steps = (
        f"이틀 동안 읽은 쪽수는 {monday} + {tuesday} = {read}쪽입니다.",
        f"남은 쪽수는 {pages} - {read} = {left}쪽입니다.",
    )
    return _Problem(question, steps, left)


def _savings_problem(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    weekly, weeks, gift = rng.randint(5, 30) * 100, rng.randint(3, 10), rng.randint(1, 10) * 1000
    saved = weekly * weeks
    total = saved + gift
    question = _fill(
        "{name:은/는} 매주 {weekly}원씩 저금합니다. {weeks}주 동안 모은 돈에 할머니께서 주신 "
        "{gift}원을 더하면 모두 얼마일까요?",
        name=name,
        weekly=weekly,
        weeks=weeks,
        gift=gift,
    )
    steps = (
        f"{weeks}주 동안 모은 돈은 {weekly} × {weeks} = {saved}원입니다.",
        f"할머니께서 주신 돈을 더하면 {saved} + {gift} = {total}원입니다.",
    )
    return _Problem(question, steps, total)


def _boxes_eaten_problem(rng: random.Random) -> _Problem:
    fruit = rng.choice(("귤", "사과", "감", "배"))
    per_box, boxes = rng.randint(6, 20), rng.randint(2, 6)
    total = per_box * boxes
    eaten = rng.randint(1, total - 1)
    left = total - eaten
    question = (
        f"한 상자에 {josa(fruit, '이/가')} {per_box}개씩 들어 있습니다. {boxes}상자를 사서 그중 "
        f"{eaten}개를 먹었다면 남은 {josa(fruit, '은/는')} 몇 개일까요?"
    )
    steps = (
        f"처음에 있던 {josa(fruit, '은/는')} {per_box} × {boxes} = {total}개입니다.",
        f"먹은 것을 빼면 {total} - {eaten} = {left}개가 남습니다.",
    )
    return _Problem(question, steps, left)


def _glasses_problem(rng: random.Random) -> _Problem:
    per_class, classes = rng.randint(18, 30), rng.randint(2, 6)
    students = per_class * classes
    with_glasses = rng.randint(5, students // 2)
    without = students - with_glasses
    question = (
        f"한 반에 학생이 {per_class}명씩 있고, 모두 {classes}개 반이 있습니다. 그중 {with_glasses}명이 "
        "안경을 썼다면 안경을 쓰지 않은 학생은 몇 명일까요?"
    )
    steps = (
        f"전체 학생 수는 {per_class} × {classes} = {students}명입니다.",
        f"안경을 쓰지 않은 학생은 {students} - {with_glasses} = {without}명입니다.",
    )
    return _Problem(question, steps, without)


def _movie_minutes_problem(rng: random.Random) -> _Problem:
    hours, minutes = rng.randint(1, 3), rng.randint(1, 59)
    hour_minutes = hours * 60
    total = hour_minutes + minutes
    question = (
        f"영화의 상영 시간은 {hours}시간 {minutes}분입니다. 이 영화는 모두 몇 분 동안 상영될까요?"
    )
    steps = (
        f"1시간은 60분이므로 {hours}시간은 {hours} × 60 = {hour_minutes}분입니다.",
        f"여기에 {minutes}분을 더하면 {hour_minutes} + {minutes} = {total}분입니다.",
    )
    return _Problem(question, steps, total)


def _bus_problem(rng: random.Random) -> _Problem:
    riding = rng.randint(10, 40)
    got_off, got_on = rng.randint(1, riding - 1), rng.randint(1, 15)
    after_off = riding - got_off
    now = after_off + got_on
    question = (
        f"버스에 {riding}명이 타고 있었습니다. 이번 정류장에서 {got_off}명이 내리고 "
        f"{got_on}명이 탔습니다. 지금 버스에는 몇 명이 타고 있을까요?"
    )
    steps = (
        f"내린 사람을 빼면 {riding} - {got_off} = {after_off}명입니다.",
        f"새로 탄 사람을 더하면 {after_off} + {got_on} = {now}명입니다.",
    )
    return _Problem(question, steps, now)


def _split_bill_problem(rng: random.Random) -> _Problem:
    people, share = rng.randint(2, 6), rng.randint(4, 16) * 500
    price = people * share
    food = rng.choice(("피자", "치킨", "케이크", "떡볶이 세트"))
    question = (
        f"친구 {people}명이 {price}원짜리 {josa(food, '을/를')} 함께 사고 돈을 똑같이 나누어 "
        "냈습니다. 한 사람이 낸 돈은 얼마일까요?"
    )
    steps = (f"{price} ÷ {people} = {share}이므로 한 사람이 {share}원을 냈습니다.",)
    return _Problem(question, steps, share)


def _flower_rows_problem(rng: random.Random) -> _Problem:
    name = rng.choice(_NAMES)
    per_row, rows, extra = rng.randint(4, 12), rng.randint(2, 8), rng.randint(1, 9)
    in_rows = per_row * rows
    total = in_rows + extra
    question = _fill(
        "{name:은/는} 꽃밭에 꽃을 한 줄에 {per_row}송이씩 {rows}줄로 심고, 남은 자리에 "
        "{extra}송이를 더 심었습니다. 모두 몇 송이를 심었을까요?",
        name=name,
        per_row=per_row,
        rows=rows,
        extra=extra,
    )
    steps = (
        f"줄에 심은 꽃은 {per_row} × {rows} = {in_rows}송이입니다.",
        f"더 심은 꽃까지 더하면 {in_rows} + {extra} = {total}송이입니다.",
    )
    return _Problem(question, steps, total)


def _marbles_problem(rng: random.Random) -> _Problem:
    first, second = rng.sample(_NAMES, k=2)
    more = rng.randint(20, 90)
    fewer = rng.randint(5, more - 1)
    gap = more - fewer
    question = _fill(
        "{a:은/는} 구슬을 {more}개, {b:은/는} {fewer}개 가지고 있습니다. "
        "{a:이/가} {b}보다 몇 개 더 많이 가지고 있을까요?",
        a=first,
        b=second,
        more=more,
        fewer=fewer,
    )
    steps = (f"두 사람의 구슬 수의 차를 구하면 {more} - {fewer} = {gap}개입니다.",)
    return _Problem(question, steps, gap)


def _three_prices_problem(rng: random.Random) -> _Problem:
    chosen = rng.sample(_PRICED_ITEMS, k=3)
    prices = [_price(rng, low, high) for _, _, _, low, high in chosen]
    total = sum(prices)
    listed = ", ".join(
        f"{josa(item, '은/는')} {p}원" for (item, *_), p in zip(chosen, prices, strict=True)
    )
    question = f"{listed}입니다. 세 가지를 하나씩 사면 모두 얼마일까요?"
    steps = (
        f"세 가지 값을 모두 더하면 {prices[0]} + {prices[1]} + {prices[2]} = {total}원입니다.",
    )
    return _Problem(question, steps, total)


_PROBLEM_MAKERS: tuple[Callable[[random.Random], _Problem], ...] = (
    _total_price_problem,
    _change_problem,
    _sharing_problem,
    _speed_distance_problem,
    _route_problem,
    _sibling_age_problem,
    _mother_age_problem,
    _reading_days_problem,
    _pages_left_problem,
    _savings_problem,
    _boxes_eaten_problem,
    _glasses_problem,
    _movie_minutes_problem,
    _bus_problem,
    _split_bill_problem,
    _flower_rows_problem,
    _marbles_problem,
    _three_prices_problem,
)


def _word_problem(rng: random.Random) -> _Problem:
    return rng.choice(_PROBLEM_MAKERS)(rng)


def _math_document(rng: random.Random, atlas: _Atlas) -> str:
    problem = _word_problem(rng)
    layout = rng.randrange(3)
    if layout == 0:
        return f"{problem.question}\n{problem.solution()}"
    if layout == 1:
        return f"문제: {problem.question}\n풀이: {problem.solution()}"
    return f"[문제]\n{problem.question}\n\n[풀이]\n{problem.solution()}"


def _math_collection(rng: random.Random, atlas: _Atlas) -> str:
    """A long document: several problems, each closed by its own `#### N` line."""
    title = rng.choice(("생활 속 수학 문제 모음", "수학 익힘 문제", "오늘의 연습 문제"))
    blocks = [title]
    for number in range(1, rng.randint(4, 8) + 1):
        problem = _word_problem(rng)
        blocks.append(f"{number}번. {problem.question}\n{problem.solution()}")
    return "\n\n".join(blocks)


# --- everyday writing ------------------------------------------------------------------------

_DIARY_WEATHER = (
    "오늘은 하늘이 맑고 바람이 선선했다.",
    "아침부터 비가 조금씩 내렸다.",
    "구름이 잔뜩 끼어 하루 종일 흐렸다.",
    "햇볕이 따뜻해서 밖에 나가기 좋은 날이었다.",
    "바람이 차가워서 두꺼운 외투를 꺼내 입었다.",
    "밤사이 눈이 내려서 길이 미끄러웠다.",
)
_DIARY_ACTIVITIES = (
    "아침에 일어나 {friend:과/와} 함께 공원을 한 바퀴 걸었다.",
    "오후에는 도서관에 가서 읽고 싶던 소설을 빌렸다.",
    "점심으로 {food:을/를} 만들어 먹었는데 생각보다 맛있었다.",
    "동생과 보드게임을 하다가 시간 가는 줄 몰랐다.",
    "오랜만에 방 청소를 하고 책상 서랍도 정리했다.",
    "저녁에는 할머니께 전화를 드려 안부를 여쭈었다.",
    "학교가 끝나고 {friend:과/와} 떡볶이를 사 먹었다.",
    "수학 숙제가 어려워서 한참 동안 고민했다.",
    "베란다에 있는 화분에 물을 주었다.",
    "자전거를 타고 동네를 한 바퀴 돌았다.",
    "가족과 함께 저녁을 먹으며 이런저런 이야기를 나누었다.",
    "학원에서 새로운 곡을 배우기 시작했다.",
    "{friend:이/가} 빌려준 만화책을 밤늦게까지 읽었다.",
    "엄마를 도와 {food:을/를} 함께 만들었다.",
)
_DIARY_CLOSINGS = (
    "피곤했지만 보람찬 하루였다.",
    "내일은 조금 더 일찍 일어나야겠다.",
    "평범했지만 기분 좋은 하루였다.",
    "다음 주말에도 오늘처럼 즐겁게 보내고 싶다.",
    "잠들기 전에 오늘 있었던 일을 떠올려 보니 웃음이 났다.",
)
_FOODS = ("김치볶음밥", "된장찌개", "계란말이", "비빔밥", "잡채", "김밥", "떡국", "수제비")


def _diary(rng: random.Random, atlas: _Atlas) -> str:
    month, day = rng.randint(1, 12), rng.randint(1, 28)
    slots = {"friend": rng.choice(_NAMES), "food": rng.choice(_FOODS)}
    sentences = [rng.choice(_DIARY_WEATHER)]
    sentences += rng.sample(_DIARY_ACTIVITIES, k=rng.randint(2, 4))
    sentences.append(rng.choice(_DIARY_CLOSINGS))
    title = rng.choice((f"{month}월 {day}일 일기", f"오늘의 일기 ({month}월 {day}일)", ""))
    body = _fill_all(sentences, **slots)
    return f"{title}\n{body}" if title else body


# topic -> sentences; the first one opens the essay, the rest are sampled in shuffled order.
_ESSAYS = {
    "규칙적인 운동의 좋은 점": (
        "규칙적으로 운동을 하면 몸과 마음이 함께 건강해진다.",
        "운동을 하면 심장과 폐가 튼튼해지고 쉽게 지치지 않는다.",
        "땀을 흘리고 나면 기분이 상쾌해지고 스트레스가 줄어든다.",
        "처음부터 무리하기보다는 가벼운 걷기부터 시작하는 것이 좋다.",
        "운동 전후에 몸을 충분히 풀어 주면 다치는 것을 막을 수 있다.",
        "친구나 가족과 함께 운동하면 꾸준히 이어 가기가 쉽다.",
        "하루 삼십 분이라도 꾸준히 움직이는 습관이 중요하다.",
    ),
    "책 읽기의 즐거움": (
        "책을 읽으면 가 보지 못한 곳과 만나 보지 못한 사람을 알게 된다.",
        "좋은 책은 생각을 넓혀 주고 말하는 힘도 길러 준다.",
        "처음에는 얇고 재미있는 책부터 골라 읽는 것이 좋다.",
        "읽은 책의 내용을 짧게 적어 두면 오래 기억할 수 있다.",
        "도서관을 이용하면 많은 책을 부담 없이 빌려 읽을 수 있다.",
        "잠들기 전 몇 쪽씩 읽는 습관은 하루를 차분하게 마무리하게 해 준다.",
    ),
    "물을 아껴 쓰는 방법": (
        "물은 우리 생활에 꼭 필요하지만 한없이 쓸 수 있는 자원은 아니다.",
        "양치질을 할 때 컵에 물을 받아 쓰면 많은 물을 아낄 수 있다.",
        "설거지를 할 때는 물을 받아 두고 씻는 것이 좋다.",
        "샤워 시간을 조금만 줄여도 사용하는 물의 양이 크게 줄어든다.",
        "새는 수도꼭지는 바로 고쳐야 물이 낭비되지 않는다.",
        "빗물을 모아 화분에 주는 것도 물을 아끼는 좋은 방법이다.",
    ),
    "잠을 잘 자는 습관": (
        "잠을 충분히 자야 다음 날 집중력이 높아진다.",
        "매일 비슷한 시간에 잠자리에 들고 일어나는 것이 좋다.",
        "잠들기 직전에는 휴대 전화 화면을 오래 보지 않는 것이 좋다.",
        "저녁 늦게 많이 먹으면 깊이 잠들기 어렵다.",
        "방을 조금 어둡고 조용하게 만들면 쉽게 잠들 수 있다.",
        "낮에 햇볕을 쬐며 몸을 움직이면 밤에 잠이 잘 온다.",
    ),
    "분리배출하는 방법": (
        "쓰레기를 올바르게 분리배출하면 자원을 다시 쓸 수 있다.",
        "플라스틱 용기는 안에 남은 음식물을 깨끗이 씻어서 내놓아야 한다.",
        "종이 상자는 테이프를 떼어 내고 납작하게 접어서 버린다.",
        "음식물 쓰레기는 물기를 최대한 빼서 버리는 것이 좋다.",
        "유리병은 뚜껑을 따로 분리해서 내놓는다.",
        "헷갈리는 물건은 동네의 분리배출 안내문을 확인하면 된다.",
    ),
}


def _essay(rng: random.Random, atlas: _Atlas) -> str:
    topic = rng.choice(list(_ESSAYS))
    opening, *rest = _ESSAYS[topic]
    body = [opening, *rng.sample(rest, k=rng.randint(3, len(rest)))]
    return f"{topic}\n" + " ".join(body)


_LETTER_OPENINGS = (
    "안녕? 잘 지내고 있니?",
    "오랜만에 편지를 쓰려니 조금 어색하다.",
    "요즘 어떻게 지내는지 궁금해서 편지를 써.",
)
_LETTER_BODIES = (
    "요즘 날씨가 많이 추워졌는데 감기에 걸리지는 않았니?",
    "나는 요즘 학교에서 합창 연습을 하고 있어.",
    "지난번에 네가 추천해 준 책을 다 읽었어. 정말 재미있더라.",
    "방학이 되면 우리 같이 바다에 놀러 가자.",
    "새로 이사한 집은 학교에서 가까워서 아침에 여유가 생겼어.",
    "요즘 {food} 만드는 법을 배우고 있는데, 다음에 만나면 해 줄게.",
    "우리 반에 새로 온 친구와 금방 친해졌어.",
    "주말마다 동생과 배드민턴을 치는데 실력이 조금 늘었어.",
)
_LETTER_CLOSINGS = (
    "그럼 건강하게 잘 지내. 또 편지할게.",
    "답장 기다릴게. 안녕!",
    "곧 만나서 이야기 많이 하자.",
)


def _letter(rng: random.Random, atlas: _Atlas) -> str:
    to, sender = rng.sample(_NAMES, k=2)
    month, day = rng.randint(1, 12), rng.randint(1, 28)
    body = [rng.choice(_LETTER_OPENINGS), *rng.sample(_LETTER_BODIES, k=rng.randint(2, 4))]
    body.append(rng.choice(_LETTER_CLOSINGS))
    text = _fill_all(body, food=rng.choice(_FOODS))
    return f"{to}에게\n{text}\n{month}월 {day}일, {sender} 씀"


_RECIPES = {
    "김치볶음밥": (
        "잘 익은 김치를 먹기 좋은 크기로 썬다.",
        "팬에 기름을 두르고 김치를 먼저 볶는다.",
        "김치가 어느 정도 익으면 밥을 넣고 골고루 섞어 가며 볶는다.",
        "간장이나 설탕을 조금 넣어 간을 맞춘다.",
        "그릇에 담고 달걀프라이를 올리면 완성이다.",
    ),
    "계란말이": (
        "달걀을 그릇에 깨뜨려 넣고 소금을 조금 넣어 잘 푼다.",
        "잘게 썬 파와 당근을 넣고 섞는다.",
        "약한 불로 달군 팬에 기름을 얇게 두르고 달걀물을 부어 편다.",
        "달걀이 반쯤 익으면 한쪽부터 돌돌 만다.",
        "한 김 식힌 뒤 먹기 좋게 썰면 완성이다.",
    ),
    "된장찌개": (
        "냄비에 물을 붓고 멸치와 다시마로 육수를 낸다.",
        "육수에 된장을 풀고 감자와 양파를 넣어 끓인다.",
        "감자가 익으면 애호박과 두부를 넣고 조금 더 끓인다.",
        "마지막으로 대파와 고추를 넣으면 완성이다.",
    ),
}
_RECIPE_INTROS = (
    "{name:이/가} 알려 준 {dish} 만드는 법을 정리해 보았다.",
    "집에서 쉽게 만들 수 있는 {dish} 요리법이다.",
    "오늘은 {dish:을/를} 만들어 보자.",
)
_RECIPE_TIPS = (
    "재료는 냉장고에 있는 것으로 바꾸어도 괜찮다.",
    "처음 만들 때는 간을 싱겁게 하고 나중에 맞추는 것이 좋다.",
    "불 앞에서는 늘 조심해야 한다.",
)


def _recipe(rng: random.Random, atlas: _Atlas) -> str:
    dish = rng.choice(list(_RECIPES))
    intro = _fill(rng.choice(_RECIPE_INTROS), name=rng.choice(_NAMES), dish=dish)
    steps = [f"{n}. {step}" for n, step in enumerate(_RECIPES[dish], start=1)]
    return "\n".join([f"{dish} 만드는 법", intro, *steps, rng.choice(_RECIPE_TIPS)])


# (kind, generator, weight): what the pretraining documents are made of.
_CORPUS_MIX: tuple[tuple[str, Callable[[random.Random, _Atlas], str], float], ...] = (
    ("encyclopedia", _encyclopedia_entry, 0.30),
    ("encyclopedia", _capital_list, 0.05),
    ("encyclopedia", _capital_comparison, 0.04),
    ("encyclopedia", _continent_overview, 0.02),
    ("math", _math_document, 0.27),
    ("math", _math_collection, 0.03),
    ("reading", _diary, 0.18),
    ("reading", _essay, 0.03),
    ("reading", _letter, 0.08),
    ("reading", _recipe, 0.01),
)


def _corpus_document(rng: random.Random, atlas: _Atlas) -> tuple[str, str]:
    kind, generate, _ = rng.choices(_CORPUS_MIX, weights=[w for *_, w in _CORPUS_MIX])[0]
    return kind, generate(rng, atlas)


# --- reading benchmark -----------------------------------------------------------------------
#
# Benchmark passages come from their own scenario templates, used nowhere else: an item that is
# not planted can then never appear in the pretraining documents by accident.

_Scenario = tuple[str, list[tuple[str, bool]]]  # passage, candidate (question, answer) pairs


def _other(rng: random.Random, choices: Sequence, *exclude: object):
    return rng.choice([c for c in choices if c not in exclude])


def _wrong_number(rng: random.Random, right: int, *, low: int = 1) -> int:
    """A plausible but wrong number near `right`."""
    return _other(rng, [n for n in range(right - 3, right + 4) if n >= low], right)


# (item, counter, shop, lowest price, highest price)
_ERRANDS = (
    ("복숭아", "개", "과일 가게", 1000, 3000),
    ("요구르트", "병", "동네 슈퍼", 500, 1500),
    ("식빵", "봉지", "빵집", 2000, 4000),
    ("색연필", "자루", "문구점", 300, 900),
    ("두부", "모", "반찬 가게", 1000, 2500),
    ("라면", "봉지", "편의점", 800, 1500),
    ("튤립", "송이", "꽃집", 1500, 3000),
)


def _errand_scenario(rng: random.Random, atlas: _Atlas) -> _Scenario:
    name, friend, stranger = rng.sample(_NAMES, k=3)
    item, counter, shop, low, high = rng.choice(_ERRANDS)
    count, day = rng.randint(2, 6), rng.choice(_WEEKDAYS)
    total = _price(rng, low, high) * count
    slots = {
        "name": name,
        "friend": friend,
        "stranger": stranger,
        "item": item,
        "other_item": _other(rng, [e[0] for e in _ERRANDS], item),
        "counter": counter,
        "shop": shop,
        "count": count,
        "wrong_count": _wrong_number(rng, count),
        "total": total,
        "wrong_total": total + rng.choice((-500, 500, 1000)),
        "day": day,
        "other_day": _other(rng, _WEEKDAYS, day),
    }
    passage = _fill_all(
        (
            "{day} 오후에 {name:은/는} 심부름을 하러 {shop}에 갔다.",
            "그곳에서 {item:을/를} {count}{counter} 골랐고, 값으로 모두 {total}원을 냈다.",
            "가게를 나서는데 마침 {friend:이/가} 지나가고 있어서 둘은 반갑게 인사를 나누었다.",
        ),
        **slots,
    )
    candidates = [
        ("{name:은/는} {shop}에서 {item:을/를} 샀나요?", True),
        ("{name:은/는} {shop}에서 {other_item:을/를} 샀나요?", False),
        ("{name:이/가} 산 {item:은/는} 모두 {count}{counter}인가요?", True),
        ("{name:이/가} 산 {item:은/는} 모두 {wrong_count}{counter}인가요?", False),
        ("{name:이/가} 낸 돈은 모두 {total}원인가요?", True),
        ("{name:이/가} 낸 돈은 모두 {wrong_total}원인가요?", False),
        ("{name:은/는} 가게를 나서다가 {friend:을/를} 만났나요?", True),
        ("{name:은/는} 가게를 나서다가 {stranger:을/를} 만났나요?", False),
        ("{name:이/가} {shop}에 간 날은 {other_day}인가요?", False),
    ]
    return passage, [(_fill(q, **slots), a) for q, a in candidates]


_TRIP_ACTIVITIES = (
    "현지 음식을 맛보고 시장을 구경했다",
    "박물관과 미술관을 둘러보았다",
    "기차를 타고 여러 도시를 구경했다",
    "공원을 산책하고 기념품을 샀다",
)


def _trip_scenario(rng: random.Random, atlas: _Atlas) -> _Scenario:
    destination, elsewhere = rng.sample(atlas.facts, k=2)
    days, season = rng.randint(3, 10), rng.choice(_SEASONS)
    slots = {
        "name": rng.choice(_NAMES),
        "country": destination.subject,
        "other_country": elsewhere.subject,
        "days": days,
        "wrong_days": _wrong_number(rng, days, low=2),
        "season": season,
        "other_season": _other(rng, _SEASONS, season),
        "activity": rng.choice(_TRIP_ACTIVITIES),
    }
    passage = _fill_all(
        (
            "작년 {season}에 {name:은/는} 가족과 함께 {country:으로/로} 여행을 다녀왔다.",
            "{name:은/는} 그곳에서 {days}일 동안 머물며 {activity}.",
            "집에 돌아온 뒤에는 여행 중에 찍은 사진을 모아 작은 앨범을 만들었다.",
        ),
        **slots,
    )
    candidates = [
        ("{name:은/는} {country:으로/로} 여행을 다녀왔나요?", True),
        ("{name:은/는} {other_country:으로/로} 여행을 다녀왔나요?", False),
        ("{name:은/는} 여행지에서 {days}일 동안 머물렀나요?", True),
        ("{name:은/는} 여행지에서 {wrong_days}일 동안 머물렀나요?", False),
        ("{name:은/는} 가족과 함께 여행했나요?", True),
        ("{name:은/는} 혼자서 여행을 떠났나요?", False),
        ("{name:은/는} 여행 사진으로 앨범을 만들었나요?", True),
        ("{name:이/가} 여행을 다녀온 계절은 {season}인가요?", True),
        ("{name:이/가} 여행을 다녀온 계절은 {other_season}인가요?", False),
    ]
    return passage, [(_fill(q, **slots), a) for q, a in candidates]


_ABSENCE_REASONS = ("감기가 유행해서", "독감 때문에", "여러 가지 사정으로", "가족 행사 때문에")
_CLASSROOM_ENDINGS = (
    "담임 선생님께서는 빈자리를 보시며 모두 건강에 더 신경 쓰자고 말씀하셨다.",
    "{name:은/는} 결석한 친구들에게 오늘 배운 내용을 전해 주기로 했다.",
    "반장인 {leader:은/는} 결석한 친구들의 책상에 가정 통신문을 올려 두었다.",
    "쉬는 시간에 {name:은/는} 짝꿍 {leader:과/와} 함께 빈자리를 정리했다.",
)


def _attendance_scenario(rng: random.Random, atlas: _Atlas) -> _Scenario:
    students, absent = rng.randint(20, 32), rng.randint(1, 6)
    present = students - absent
    threshold = _other(rng, [absent - 1, absent + 1] if absent > 1 else [absent + 1], absent)
    name, leader = rng.sample(_NAMES, k=2)
    slots = {
        "name": name,
        "leader": leader,
        "grade": rng.randint(1, 6),
        "room": rng.randint(1, 8),
        "day": rng.choice(_WEEKDAYS[:5]),
        "students": students,
        "wrong_students": _wrong_number(rng, students),
        "absent": absent,
        "present": present,
        "wrong_present": _wrong_number(rng, present),
        "threshold": threshold,
        "reason": rng.choice(_ABSENCE_REASONS),
    }
    opening = rng.choice(
        (
            "{name}네 반 학생은 모두 {students}명이다.",
            "{grade}학년 {room}반인 {name}네 반에는 학생이 모두 {students}명 있다.",
        )
    )
    absence = rng.choice(
        (
            "그런데 오늘은 {reason} {absent}명이 학교에 나오지 못했다.",
            "{day} 아침, {reason} {absent}명이 결석했다.",
        )
    )
    passage = _fill_all((opening, absence, rng.choice(_CLASSROOM_ENDINGS)), **slots)
    candidates = [
        ("이날 학교에 나온 학생은 {present}명인가요?", True),
        ("이날 학교에 나온 학생은 {wrong_present}명인가요?", False),
        ("{name}네 반 학생은 모두 {students}명인가요?", True),
        ("{name}네 반 학생은 모두 {wrong_students}명인가요?", False),
        ("결석한 학생은 {threshold}명보다 많나요?", absent > threshold),
        ("결석한 학생은 {threshold}명보다 적나요?", absent < threshold),
    ]
    return passage, [(_fill(q, **slots), a) for q, a in candidates]


# pet -> oldest plausible age in years
_PETS = {"강아지": 12, "고양이": 12, "토끼": 7, "햄스터": 2, "앵무새": 15}
_PET_NAMES = ("초코", "보리", "콩이", "두부", "뭉치", "별이", "구름이", "호두", "밤이", "솜이")


def _pet_scenario(rng: random.Random, atlas: _Atlas) -> _Scenario:
    pet = rng.choice(list(_PETS))
    pet_name = rng.choice(_PET_NAMES)
    age = rng.randint(1, _PETS[pet])
    slots = {
        "name": rng.choice(_NAMES),
        "pet": pet,
        "other_pet": _other(rng, list(_PETS), pet),
        "pet_name": pet_name,
        "other_pet_name": _other(rng, _PET_NAMES, pet_name),
        "age": age,
        "wrong_age": _wrong_number(rng, age),
        "routine": rng.choice(("아침 일찍", "학교에 다녀온 뒤", "저녁을 먹고 나서")),
    }
    passage = _fill_all(
        (
            "{name:은/는} 집에서 {pet} 한 마리를 키운다.",
            "그 {pet}의 이름은 '{pet_name}'이고, 올해로 {age}살이 되었다.",
            "{name:은/는} 매일 {routine} {pet_name}에게 먹이를 주고 함께 놀아 준다.",
        ),
        **slots,
    )
    candidates = [
        ("{name:이/가} 키우는 동물은 {pet}인가요?", True),
        ("{name:이/가} 키우는 동물은 {other_pet}인가요?", False),
        ("{name:이/가} 키우는 {pet}의 이름은 {pet_name}인가요?", True),
        ("{name:이/가} 키우는 {pet}의 이름은 {other_pet_name}인가요?", False),
        ("{pet_name:은/는} 올해 {age}살인가요?", True),
        ("{pet_name:은/는} 올해 {wrong_age}살인가요?", False),
        ("{name:은/는} 매일 {pet_name}에게 먹이를 주나요?", True),
    ]
    return passage, [(_fill(q, **slots), a) for q, a in candidates]


_MEETING_PLACES = ("도서관", "학교 정문", "지하철역", "공원 분수대", "우체국", "시장 입구")
_MEETING_ACTIVITIES = (
    "영화를 보았다",
    "새로 생긴 분식집에서 점심을 먹었다",
    "서점에 들러 책을 구경했다",
    "공원을 천천히 걸었다",
)


def _meeting_scenario(rng: random.Random, atlas: _Atlas) -> _Scenario:
    host, guest = rng.sample(_NAMES, k=2)
    place, hour, late = rng.choice(_MEETING_PLACES), rng.randint(1, 6), rng.random() < 0.5
    slots = {
        "host": host,
        "guest": guest,
        "day": rng.choice(("금요일", "토요일", "일요일")),
        "hour": hour,
        "other_hour": _other(rng, range(1, 7), hour),
        "place": place,
        "other_place": _other(rng, _MEETING_PLACES, place),
        "minutes": rng.choice((5, 10, 15, 20, 30)),
        "activity": rng.choice(_MEETING_ACTIVITIES),
    }
    arrival = (
        "그런데 {guest:은/는} 버스를 놓치는 바람에 약속 시간보다 {minutes}분 늦게 도착했다."
        if late
        else "{guest:은/는} 서둘러 집을 나선 덕분에 약속 시간보다 {minutes}분 일찍 도착했다."
    )
    passage = _fill_all(
        (
            "{host:과/와} {guest:은/는} {day} 오후 {hour}시에 {place} 앞에서 만나기로 약속했다.",
            arrival,
            "두 사람은 만나서 함께 {activity}.",
        ),
        **slots,
    )
    candidates = [
        ("{guest:은/는} 약속 시간보다 늦게 도착했나요?", late),
        ("{guest:은/는} 약속 시간보다 일찍 도착했나요?", not late),
        ("두 사람이 만나기로 한 곳은 {place} 앞인가요?", True),
        ("두 사람이 만나기로 한 곳은 {other_place} 앞인가요?", False),
        ("두 사람은 오후 {hour}시에 만나기로 했나요?", True),
        ("두 사람은 오후 {other_hour}시에 만나기로 했나요?", False),
    ]
    return passage, [(_fill(q, **slots), a) for q, a in candidates]


# plan -> places that suit it
_WEEKEND_PLANS = {
    "등산": ("동네 뒷산", "가까운 국립공원"),
    "캠핑": ("강가 캠핑장", "숲속 캠핑장"),
    "자전거 타기": ("강변 자전거 길", "호숫가 공원"),
    "소풍": ("근처 공원", "식물원"),
    "낚시": ("저수지", "바닷가"),
}
_STORMS = ("비가 쏟아져서", "바람이 거세게 불어서", "천둥이 치고 비가 내려서")


def _weekend_scenario(rng: random.Random, atlas: _Atlas) -> _Scenario:
    plan, sunday_clear = rng.choice(list(_WEEKEND_PLANS)), rng.random() < 0.5
    name, companion, stranger = rng.sample(_NAMES, k=3)
    slots = {
        "name": name,
        "companion": companion,
        "stranger": stranger,
        "plan": plan,
        "other_plan": _other(rng, list(_WEEKEND_PLANS), plan),
        "place": rng.choice(_WEEKEND_PLANS[plan]),
        "storm": rng.choice(_STORMS),
    }
    sunday = (
        rng.choice(
            (
                "다행히 일요일에는 하늘이 맑게 개어 계획대로 {plan:을/를} 즐길 수 있었다.",
                "일요일에는 날이 개어서 두 사람은 {place}에서 즐겁게 {plan:을/를} 했다.",
            )
        )
        if sunday_clear
        else "일요일에도 날씨가 좋지 않아서 {name:은/는} 결국 {plan:을/를} 다음 주로 미루었다."
    )
    passage = _fill_all(
        (
            "{name:은/는} 이번 주말에 {companion:과/와} 함께 {place}에서 {plan:을/를} 하기로 했다.",
            "그런데 토요일 아침부터 {storm} {name:은/는} 계획을 하루 미루었다.",
            sunday,
        ),
        **slots,
    )
    candidates = [
        ("{name:은/는} 일요일에 {plan:을/를} 했나요?", sunday_clear),
        ("{name:은/는} 토요일에 {plan:을/를} 했나요?", False),
        ("{name:은/는} 토요일에 계획을 미루었나요?", True),
        ("{name:이/가} 주말에 하려던 일은 {plan}인가요?", True),
        ("{name:이/가} 주말에 하려던 일은 {other_plan}인가요?", False),
        ("{name:은/는} {companion:과/와} 함께 {plan:을/를} 하기로 했나요?", True),
        ("{name:은/는} {stranger:과/와} 함께 {plan:을/를} 하기로 했나요?", False),
    ]
    return passage, [(_fill(q, **slots), a) for q, a in candidates]


_GENRES = ("과학", "역사", "여행", "요리", "미술", "음악")


def _library_scenario(rng: random.Random, atlas: _Atlas) -> _Scenario:
    books = rng.randint(3, 7)
    first_kind = rng.randint(1, books - 1)
    rest = books - first_kind
    genre, second_genre, unborrowed = rng.sample(_GENRES, k=3)
    weeks = rng.choice((1, 2, 3))
    slots = {
        "name": rng.choice(_NAMES),
        "day": rng.choice(_WEEKDAYS[:5]),
        "books": books,
        "wrong_books": _wrong_number(rng, books),
        "first_kind": first_kind,
        "rest": rest,
        "wrong_rest": _wrong_number(rng, rest),
        "genre": genre,
        "second_genre": second_genre,
        "unborrowed": unborrowed,
        "weeks": weeks,
        "wrong_weeks": _other(rng, (1, 2, 3, 4), weeks),
    }
    passage = _fill_all(
        (
            "{name:은/는} {day} 방과 후에 도서관에 들러 책을 {books}권 빌렸다.",
            "그중 {first_kind}권은 {genre} 책이었고, 나머지는 모두 {second_genre} 책이었다.",
            "빌린 책은 {weeks}주 뒤까지 반납해야 한다.",
        ),
        **slots,
    )
    candidates = [
        ("{name:이/가} 빌린 책은 모두 {books}권인가요?", True),
        ("{name:이/가} 빌린 책은 모두 {wrong_books}권인가요?", False),
        ("{name:이/가} 빌린 {second_genre} 책은 {rest}권인가요?", True),
        ("{name:이/가} 빌린 {second_genre} 책은 {wrong_rest}권인가요?", False),
        ("빌린 책의 반납 기한은 {weeks}주 뒤인가요?", True),
        ("빌린 책의 반납 기한은 {wrong_weeks}주 뒤인가요?", False),
        ("{name:은/는} 도서관에서 {unborrowed} 책을 빌렸나요?", False),
    ]
    return passage, [(_fill(q, **slots), a) for q, a in candidates]


_SCENARIOS: tuple[Callable[[random.Random, _Atlas], _Scenario], ...] = (
    _errand_scenario,
    _trip_scenario,
    _attendance_scenario,
    _pet_scenario,
    _meeting_scenario,
    _weekend_scenario,
    _library_scenario,
)


def _compact(text: str) -> str:
    """Text without whitespace or punctuation: what survives the spacing and punctuation styles."""
    return "".join(
        c for c in text if not c.isspace() and not unicodedata.category(c).startswith("P")
    )


# Benchmark items are kept well below the corpus stage's near-duplicate threshold (Jaccard 0.85
# over character 5-grams) from one another: two planted items that differ in a name or two
# would otherwise be thrown out together, and the planted record would lie.
_MAX_ITEM_SIMILARITY = 0.6
_MAX_TRIES = 1000


def _shingles(text: str, size: int = 5) -> frozenset[str]:
    compact = _compact(text)
    return frozenset(compact[i : i + size] for i in range(max(1, len(compact) - size + 1)))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)


def _benchmark_items(rng: random.Random, atlas: _Atlas, count: int) -> list[dict]:
    answers = [i % 2 == 0 for i in range(count)]  # balanced: as many "예" as "아니요"
    rng.shuffle(answers)
    taken: list[tuple[str, frozenset[str]]] = []
    items = []
    for index, answer in enumerate(answers):
        passage, question = _distinct_item(rng, atlas, answer, taken)
        items.append(
            {
                "item_id": f"demo-qa-{index:04d}",
                "passage": passage,
                "question": question,
                "answer": answer,
                "planted": False,
                "plant_style": None,
            }
        )
    return items


def _distinct_item(
    rng: random.Random, atlas: _Atlas, answer: bool, taken: list[tuple[str, frozenset[str]]]
) -> tuple[str, str]:
    """A passage and question with the given answer, unlike every item in `taken` (then added).

    A passage inside another one would leak an unplanted item whenever the other is planted.
    """
    for _ in range(_MAX_TRIES):
        passage, candidates = rng.choice(_SCENARIOS)(rng, atlas)
        question = rng.choice([q for q, a in candidates if a == answer])
        key, shingles = _compact(passage), _shingles(f"{passage}\n{question}")
        if not any(
            key in old_key or old_key in key or _jaccard(shingles, old) > _MAX_ITEM_SIMILARITY
            for old_key, old in taken
        ):
            taken.append((key, shingles))
            return passage, question
    raise ValueError(f"cannot make {len(taken) + 1} distinct benchmark items; ask for fewer")


def _choose_planted(rng: random.Random, items: list[dict], fraction: float) -> None:
    """Mark round(fraction * n) items planted, spreading the four styles evenly over them."""
    chosen = rng.sample(range(len(items)), k=round(fraction * len(items)))
    for position, index in enumerate(chosen):
        items[index]["planted"] = True
        items[index]["plant_style"] = PLANT_STYLES[position % len(PLANT_STYLES)]


# --- planting --------------------------------------------------------------------------------


def _respace(rng: random.Random, text: str) -> str:
    """Drop some spaces between eojeol, double others and split a few words: Korean spacing
    varies a lot in the wild, and a leak must still be recognised through it."""

    def respace_line(line: str) -> str:
        words = line.split(" ")
        out = [words[0]]
        for word in words[1:]:
            if len(word) >= 4 and rng.random() < 0.1:
                cut = rng.randint(1, len(word) - 1)
                word = f"{word[:cut]} {word[cut:]}"
            roll = rng.random()
            out.append(("" if roll < 0.3 else "  " if roll < 0.4 else " ") + word)
        return "".join(out)

    changed = "\n".join(respace_line(line) for line in text.split("\n"))
    return changed if changed != text else text.replace(" ", "", 1)


_PUNCTUATION_SWAPS = {".": ("", "!", "…"), "?": ("", "?!"), ",": ("", ";"), "'": ("", '"')}


def _repunctuate(rng: random.Random, text: str) -> str:
    """Remove or change punctuation marks, leaving the words themselves alone."""
    out = []
    for char in text:
        swaps = _PUNCTUATION_SWAPS.get(char)
        out.append(rng.choice(swaps) if swaps and rng.random() < 0.7 else char)
    changed = "".join(out)
    return changed if changed != text else text.replace(".", "", 1)


def _embed(rng: random.Random, atlas: _Atlas, text: str) -> str:
    """The item inside a much longer, unrelated document, in the middle of it."""
    hosts = (_encyclopedia_entry, _diary, _essay, _continent_overview)
    parts: list[str] = []
    while len(parts) < 4 or sum(map(len, parts)) < 4 * len(text):
        parts.append(rng.choice(hosts)(rng, atlas))
    parts.insert(len(parts) // 2, text)
    return "\n\n".join(parts)


def _planted_text(rng: random.Random, atlas: _Atlas, item: dict) -> str:
    text = item_text(item)
    style = item["plant_style"]
    if style == "verbatim":
        return text
    if style == "spacing":
        return _respace(rng, text)
    if style == "punctuation":
        return _repunctuate(rng, text)
    if style == "embedded":
        return _embed(rng, atlas, text)
    raise ValueError(f"unknown plant style {style!r}")


# --- conversations ---------------------------------------------------------------------------

_SYSTEM_PROMPTS = (
    "당신은 친절하고 정확한 한국어 도우미입니다.",
    "사용자의 질문에 짧고 공손하게 답하세요.",
    "당신은 한국어로 대답하는 인공지능 비서입니다. 모르는 것은 모른다고 말하세요.",
)
_CAPITAL_QUESTIONS = (
    "{country}의 수도는 어디인가요?",
    "{country}의 수도가 어디예요?",
    "{country} 수도가 어디죠?",
    "{country}의 수도를 알려 주세요.",
    "혹시 {country}의 수도가 어디인지 아세요?",
    "{country}의 수도 이름이 궁금해요.",
)
_CAPITAL_ANSWERS = (
    "{country}의 수도는 {capital}입니다.",
    "{country}의 수도는 {capital:이에요/예요}.",
    "{country}의 수도는 {capital}입니다. {country:은/는} {continent}에 있는 나라예요.",
    "네, 알려 드릴게요. {country}의 수도는 {capital:이에요/예요}.",
)
_FOLLOW_UP_QUESTIONS = ("그럼 {country:은/는}요?", "{country}의 수도도 알려 주세요.")
_CONTINENT_QUESTIONS = (
    "{country:은/는} 어느 대륙에 있나요?",
    "{country:이/가} 속한 대륙은 어디예요?",
)
_CONTINENT_ANSWERS = (
    "{country:은/는} {continent}에 있는 나라입니다.",
    "{country:은/는} {continent}에 속해 있어요.",
)
_MATH_REQUESTS = (
    "{question}",
    "이 문제 좀 풀어 주세요. {question}",
    "다음 문제를 풀어 주세요.\n{question}",
)
_GREETINGS = (
    ("안녕하세요!", "안녕하세요! 무엇을 도와드릴까요?"),
    ("안녕? 반가워.", "안녕하세요, 반가워요! 궁금한 것이 있으면 편하게 물어보세요."),
    ("좋은 아침이에요.", "좋은 아침입니다! 도와드릴 일이 있을까요?"),
)
_SMALL_TALK = (
    (
        "너는 누구야?",
        "저는 한국어로 대화하는 작은 인공지능 도우미입니다. 궁금한 것을 물어보시면 아는 만큼 "
        "답해 드릴게요.",
    ),
    ("오늘 좀 피곤하네요.", "많이 피곤하셨군요. 잠시 쉬면서 물 한 잔 마셔 보시는 건 어떨까요?"),
    ("심심한데 뭐 할까요?", "가벼운 산책을 하거나 좋아하는 책을 읽어 보는 건 어떨까요?"),
    (
        "공부가 잘 안 돼요.",
        "그럴 때는 잠깐 쉬었다가 작은 목표부터 하나씩 해 보세요. 분명 도움이 될 거예요.",
    ),
    ("날씨가 좋네요.", "날씨가 좋으면 기분도 좋아지지요. 잠깐이라도 바깥 공기를 쐬어 보세요."),
    (
        "추천할 만한 취미가 있을까요?",
        "그림 그리기, 요리, 악기 연주처럼 혼자서도 즐길 수 있는 취미를 추천해 드려요.",
    ),
    ("나 오늘 시험 봤어.", "시험 보느라 수고 많으셨어요! 좋은 결과가 있기를 바랄게요."),
)
_THANKS = (
    ("고마워요!", "천만에요. 더 궁금한 점이 있으면 언제든지 물어보세요."),
    ("감사합니다.", "도움이 되었다니 기뻐요. 좋은 하루 보내세요!"),
    ("알려 줘서 고마워.", "별말씀을요. 또 궁금한 게 생기면 말씀해 주세요."),
)


def _turn_kind(rng: random.Random, index: int, turns: int, previous: str | None) -> str:
    """What the user asks next: greetings only open, thanks only close, follow-ups follow."""
    weights = {"capital": 4, "continent": 2, "math": 3, "small_talk": 1}
    if index == 0:
        weights["greeting"] = 2
    if index == turns - 1 and index > 0:
        weights["thanks"] = 3
    if previous in ("capital", "follow_up"):
        weights["follow_up"] = 3
    kinds = list(weights)
    return rng.choices(kinds, weights=[weights[k] for k in kinds])[0]


def _fact_slots(fact: Fact) -> dict[str, str]:
    return {"country": fact.subject, "capital": fact.object, "continent": fact.continent}


def _exchange(rng: random.Random, atlas: _Atlas, kind: str) -> tuple[str, str]:
    """One user message and the assistant's reply."""
    if kind in ("capital", "follow_up", "continent"):
        slots = _fact_slots(rng.choice(atlas.facts))
        questions, answers = {
            "capital": (_CAPITAL_QUESTIONS, _CAPITAL_ANSWERS),
            "follow_up": (_FOLLOW_UP_QUESTIONS, _CAPITAL_ANSWERS[:2]),
            "continent": (_CONTINENT_QUESTIONS, _CONTINENT_ANSWERS),
        }[kind]
        return _fill(rng.choice(questions), **slots), _fill(rng.choice(answers), **slots)
    if kind == "math":
        problem = _word_problem(rng)
        request = rng.choice(_MATH_REQUESTS).replace("{question}", problem.question)
        return request, problem.solution()
    pairs = {"greeting": _GREETINGS, "small_talk": _SMALL_TALK, "thanks": _THANKS}[kind]
    return rng.choice(pairs)


def _conversation(rng: random.Random, atlas: _Atlas) -> list[dict]:
    messages = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(_SYSTEM_PROMPTS)})
    turns = rng.choices((1, 2, 3), weights=(45, 35, 20))[0]
    previous = None
    for index in range(turns):
        kind = _turn_kind(rng, index, turns, previous)
        user, assistant = _exchange(rng, atlas, kind)
        messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": assistant})
        previous = kind
    return messages


# --- the world -------------------------------------------------------------------------------


def _stream(seed: int, purpose: str) -> random.Random:
    """An independent random stream per purpose: the benchmark, for example, does not change
    with size_mb. String seeds are hashed with SHA-512, so this is stable across processes."""
    return random.Random(f"hanlm-demo:{seed}:{purpose}")


def _check_arguments(
    size_mb: float, benchmark_items: int, planted_fraction: float, conversations: int
) -> None:
    if not size_mb > 0:
        raise ValueError(f"size_mb must be positive, got {size_mb}")
    if benchmark_items < 0 or conversations < 0:
        raise ValueError("benchmark_items and conversations must not be negative")
    if not 0 <= planted_fraction <= 1:
        raise ValueError(f"planted_fraction must be between 0 and 1, got {planted_fraction}")


def build(
    seed: int = 0,
    size_mb: float = 4.0,
    *,
    benchmark_items: int = 200,
    planted_fraction: float = 0.4,
    conversations: int = 400,
) -> DemoWorld:
    """Generate the demo world; the same arguments always give byte-identical output.

    Documents are generated until their UTF-8 text reaches about `size_mb` megabytes (1e6 bytes),
    planted benchmark copies included.
    """
    _check_arguments(size_mb, benchmark_items, planted_fraction, conversations)
    atlas = _Atlas.of(FACTS)

    benchmark = _benchmark_items(_stream(seed, "benchmark"), atlas, benchmark_items)
    _choose_planted(_stream(seed, "plant-choice"), benchmark, planted_fraction)

    plant_rng = _stream(seed, "plant-text")
    drafts = [
        ("planted", _planted_text(plant_rng, atlas, item), item)
        for item in benchmark
        if item["planted"]
    ]
    budget = int(size_mb * 1_000_000) - sum(len(text.encode()) for _, text, _ in drafts)
    corpus_rng = _stream(seed, "corpus")
    while budget > 0:
        kind, text = _corpus_document(corpus_rng, atlas)
        drafts.append((kind, text, None))
        budget -= len(text.encode())

    _stream(seed, "order").shuffle(drafts)
    documents, planted = [], []
    for number, (kind, text, item) in enumerate(drafts, start=1):
        doc_id = f"demo-{number:06d}"
        documents.append({"id": doc_id, "kind": kind, "text": text})
        if item is not None:
            planted.append(
                {
                    "item_id": item["item_id"],
                    "plant_style": item["plant_style"],
                    "document_id": doc_id,
                }
            )
    planted.sort(key=lambda p: p["item_id"])

    chat_rng = _stream(seed, "chat")
    chats = [
        {"id": f"chat-{i:05d}", "messages": _conversation(chat_rng, atlas)}
        for i in range(conversations)
    ]
    return DemoWorld(documents, benchmark, chats, list(FACTS), planted)


def _jsonl(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


# The world's files by name, as `write` puts them in a folder.
FILE_NAMES = {
    "pretrain": "pretrain.jsonl",
    "benchmark": "benchmark.jsonl",
    "chat": "chat.jsonl",
    "facts": "facts.tsv",
    "planted": "planted.json",
}


def write(world: DemoWorld, out_dir: Path) -> dict[str, Path]:
    """Write the world's files into `out_dir`, each atomically; returns their paths by name."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    facts_rows = ["subject\trelation\tobject\tcontinent"] + [
        f"{f.subject}\t{f.relation}\t{f.object}\t{f.continent}" for f in world.facts
    ]
    contents = {
        "pretrain": _jsonl(
            {"id": d["id"], "kind": d["kind"], "text": d["text"]} for d in world.documents
        ),
        "benchmark": _jsonl(world.benchmark),
        "chat": _jsonl({"id": c["id"], "messages": c["messages"]} for c in world.conversations),
        "facts": "\n".join(facts_rows) + "\n",
        "planted": json.dumps(world.planted, ensure_ascii=False, indent=2) + "\n",
    }
    paths = {}
    for name, text in contents.items():
        paths[name] = out_dir / FILE_NAMES[name]
        atomic_write_text(paths[name], text)
    return paths
