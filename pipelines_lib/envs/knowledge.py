"""A small generated knowledge base (people, cities, countries) for the ``search`` tool.

Everything is made up and deterministic in :attr:`KnowledgeConfig.seed`, so questions about it can
only be answered by looking things up (no model has memorised "where Tomaki was born"), and a
question like "What is the capital of the country where Tomaki was born?" needs three lookups:
person -> city -> country. Names are built from a few syllables to keep the tokenizer's vocabulary
small. One entry per entity, as one line of ``key value`` facts::

    Tomaki: born in Velora; works in Sarun
    Velora: city in Kenatu
    Kenatu: capital Rimado; currency lira
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass

SYLLABLES: tuple[str, ...] = (
    "ka", "lo", "mi", "ra", "te", "su", "no", "vi", "da", "re", "pa", "zo", "ki", "ma", "lu", "be",
)  # fmt: skip
CURRENCIES: tuple[str, ...] = ("lira", "mark", "crown", "dinar", "peso", "franc", "rand", "yen")


@dataclass(frozen=True, kw_only=True)
class KnowledgeConfig:
    seed: int = 0
    """The world: same seed, same people, cities and countries."""
    n_countries: int = 8
    """Countries, each with a capital and a currency (the last hop's answers)."""
    n_cities: int = 24
    """Cities, each in one country (at least one per country)."""
    n_people: int = 500
    """Four question kinds per person: 2000 multihop questions by default."""

    def __post_init__(self) -> None:
        if not 1 <= self.n_countries <= len(CURRENCIES) * 4:
            raise ValueError(f"n_countries must be in 1..{len(CURRENCIES) * 4}, got {self.n_countries}")
        if self.n_cities < self.n_countries:
            raise ValueError(f"n_cities ({self.n_cities}) must be >= n_countries ({self.n_countries})")
        if self.n_people < 1:
            raise ValueError(f"n_people must be >= 1, got {self.n_people}")
        if self.n_countries + self.n_cities + self.n_people > 3000:
            raise ValueError("at most 3000 entities fit the name space")


@dataclass(frozen=True, kw_only=True)
class Country:
    name: str
    capital: str
    currency: str

    def entry(self) -> str:
        return f"{self.name}: capital {self.capital}; currency {self.currency}"


@dataclass(frozen=True, kw_only=True)
class City:
    name: str
    country: str

    def entry(self) -> str:
        return f"{self.name}: city in {self.country}"


@dataclass(frozen=True, kw_only=True)
class Person:
    name: str
    born_in: str
    works_in: str

    def entry(self) -> str:
        return f"{self.name}: born in {self.born_in}; works in {self.works_in}"


@dataclass(frozen=True)
class KnowledgeBase:
    countries: dict[str, Country]
    cities: dict[str, City]
    people: dict[str, Person]

    @classmethod
    def generate(cls, config: KnowledgeConfig) -> KnowledgeBase:
        rng = random.Random(f"knowledge/{config.seed}")
        used: set[str] = set()

        def fresh_name() -> str:
            while True:
                name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
                if name not in used:
                    used.add(name)
                    return name

        country_names = [fresh_name() for _ in range(config.n_countries)]
        # Every country gets at least one city (its capital); the rest are spread at random.
        city_country = country_names + [
            rng.choice(country_names) for _ in range(config.n_cities - config.n_countries)
        ]
        cities = {name: City(name=name, country=c) for name, c in ((fresh_name(), c) for c in city_country)}
        capitals = {c.country: c.name for c in reversed(list(cities.values()))}
        countries = {
            n: Country(name=n, capital=capitals[n], currency=CURRENCIES[i % len(CURRENCIES)])
            for i, n in enumerate(country_names)
        }
        city_names = list(cities)
        people = {}
        for _ in range(config.n_people):
            name = fresh_name()
            people[name] = Person(
                name=name,
                born_in=rng.choice(city_names),
                works_in=rng.choice(city_names),
            )
        return cls(countries=countries, cities=cities, people=people)

    def entry(self, name: str) -> str | None:
        """The fact line of the entity called ``name`` (case-insensitive), if any."""
        key = name.strip().capitalize()
        for table in (self.people, self.cities, self.countries):
            if key in table:
                return table[key].entry()
        return None

    def names(self) -> list[str]:
        return [*self.countries, *self.cities, *self.people]

    def search(self, query: str) -> str:
        """Entries whose name occurs in ``query``; else a "did you mean" line."""
        exact = self.entry(query)
        if exact is not None:
            return exact
        words = {w.strip(".,;:?!'\"").capitalize() for w in query.split()}
        hits = [e for w in sorted(words) if (e := self.entry(w)) is not None]
        if hits:
            return "\n".join(hits[:3])
        close = difflib.get_close_matches(query.strip().capitalize(), self.names(), n=3)
        return f"No entry for {query.strip()!r}." + (f" Did you mean: {', '.join(close)}?" if close else "")
