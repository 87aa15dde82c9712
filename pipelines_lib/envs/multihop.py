"""``multihop``: questions over the generated knowledge base that need 2-3 ``search`` calls.

"What is the capital of the country where Tomaki was born?" -> search Tomaki (born in Velora) ->
search Velora (in Kenatu) -> search Kenatu (capital Rimado) -> ``<answer>Rimado</answer>``.
Question kinds differ in which attribute starts the chain (``born in``/``works in``) and what the
last hop asks (country, capital, currency). Flawed demonstrations stop a hop early, follow the
wrong attribute, or copy the wrong name; each scores 0.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from pipelines_lib.envs.base import (
    BaseTaskEnv,
    Message,
    Task,
    answer_text,
    draw_unique_tasks,
    extract_answers,
    hermes_tool_call,
    task_id_for,
)
from pipelines_lib.envs.knowledge import KnowledgeBase, KnowledgeConfig
from pipelines_lib.envs.registry import register_env
from pipelines_lib.envs.tools.search import SearchTool

# kind -> (question template, person attribute that starts the chain, what the last hop returns)
QUESTIONS: dict[str, tuple[str, str, str]] = {
    "born_country": ("In which country was {person} born?", "born_in", "country"),
    "work_country": ("In which country does {person} work?", "works_in", "country"),
    "born_capital": ("What is the capital of the country where {person} was born?", "born_in", "capital"),
    "work_currency": ("What is the currency of the country where {person} works?", "works_in", "currency"),
}

SYSTEM_PROMPT = "Use the search tool to look up each name. Give the final answer as <answer>NAME</answer>."


@dataclass(frozen=True, kw_only=True)
class MultihopConfig:
    knowledge: KnowledgeConfig = field(default_factory=KnowledgeConfig)
    """The world the questions are about (the search tool serves the same one)."""
    kinds: tuple[str, ...] = tuple(QUESTIONS)
    """Question kinds to draw from (keys of ``QUESTIONS``)."""
    heldout_fraction: float = 0.2
    """Share of the task space (by question) reserved for the held-out split."""
    max_turns: int = 5
    """Assistant messages per episode: up to three searches and the answer, plus one spare."""

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(QUESTIONS)
        if not self.kinds or unknown:
            raise ValueError(f"kinds must be a non-empty subset of {sorted(QUESTIONS)}, got {self.kinds}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")

    @classmethod
    def tiny(cls) -> MultihopConfig:
        return cls(knowledge=KnowledgeConfig(n_countries=4, n_cities=8, n_people=60))


def _chain(kb: KnowledgeBase, person: str, start_attr: str, last: str) -> tuple[list[str], str]:
    """Names to search, in order, and the answer the last entry gives."""
    city = getattr(kb.people[person], start_attr)
    country = kb.cities[city].country
    if last == "country":
        return [person, city], country
    return [person, city, country], getattr(kb.countries[country], last)


@register_env("multihop")
class MultihopEnv(BaseTaskEnv):
    system_prompt = SYSTEM_PROMPT
    config_class: ClassVar[type] = MultihopConfig

    def __init__(self, *, config: MultihopConfig = MultihopConfig(), kb: KnowledgeBase | None = None) -> None:
        """``kb``: the world of ``config.knowledge``, pre-built to share between episodes.

        Tasks carry their world's config, so an env switches to a task's world on :meth:`reset`
        (and in :meth:`demonstration`): ``make_env("multihop")`` serves tasks of any world.
        """
        super().__init__(max_turns=config.max_turns)
        self.config = config
        self._world = config.knowledge
        self.kb = kb if kb is not None else KnowledgeBase.generate(config.knowledge)
        self._search = SearchTool(kb=self.kb)
        self._set_tools([self._search])

    def _use_world_of(self, task: Task) -> None:
        world = KnowledgeConfig(**task.meta["knowledge"])
        if world != self._world:
            # Swap the knowledge inside the existing tool so wrappers (latency, counting) stay.
            self._world, self.kb = world, KnowledgeBase.generate(world)
            self._search.kb = self.kb

    async def reset(self, task: Task) -> list[Message]:
        self._use_world_of(task)
        return await super().reset(task)

    @classmethod
    def generate_tasks(
        cls, *, seed: int, n: int, split: str, config: MultihopConfig | None = None
    ) -> list[Task]:
        cfg = config or MultihopConfig()
        kb = KnowledgeBase.generate(cfg.knowledge)
        people = sorted(kb.people)

        def draw(rng: random.Random) -> tuple[str, Callable[[], Task]]:
            kind, person = rng.choice(cfg.kinds), rng.choice(people)
            template, start_attr, last = QUESTIONS[kind]
            prompt = template.format(person=person)
            return prompt, lambda: Task(
                task_id=task_id_for(cls.name, prompt),
                env_name=cls.name,
                prompt=prompt,
                answer=_chain(kb, person, start_attr, last)[1],
                meta={"kind": kind, "person": person, "knowledge": dataclasses.asdict(cfg.knowledge)},
            )

        return draw_unique_tasks(
            env_name=cls.name, seed=seed, n=n, split=split, heldout_fraction=cfg.heldout_fraction, draw=draw
        )

    def reward(self, task: Task, response: str) -> tuple[float, dict[str, float]]:
        answers = extract_answers(response)
        correct = float(bool(answers) and answers[-1].lower() == task.answer.lower())
        return correct, {"correct": correct, "format": float(len(answers) == 1)}

    def _demonstration(self, task: Task, *, corrupt: bool, rng: random.Random) -> list[Message]:
        self._use_world_of(task)
        _, start_attr, last = QUESTIONS[task.meta["kind"]]
        queries, answer = _chain(self.kb, task.meta["person"], start_attr, last)
        if corrupt:
            queries, answer = self._mistake(task, queries, start_attr, last, rng)
        messages: list[Message] = []
        for q in queries:
            messages.append({"role": "assistant", "content": hermes_tool_call("search", {"query": q})})
            messages.append({"role": "tool", "name": "search", "content": self.kb.search(q)})
        messages.append({"role": "assistant", "content": answer_text(answer)})
        return messages

    def _mistake(
        self, task: Task, queries: list[str], start_attr: str, last: str, rng: random.Random
    ) -> tuple[list[str], str]:
        """A flawed lookup chain whose answer differs from ``task.answer``."""
        mistake = rng.choice(("stop_early", "wrong_attribute", "wrong_copy"))
        if mistake == "wrong_attribute":
            other = "works_in" if start_attr == "born_in" else "born_in"
            q, a = _chain(self.kb, task.meta["person"], other, last)
            if a.lower() != task.answer.lower():
                return q, a
        if mistake in ("stop_early", "wrong_attribute"):
            # The last entry read names the previous hop's entity, not the one asked for.
            return queries[:-1], queries[-1]
        pool = {
            "country": list(self.kb.countries),
            "capital": [c.capital for c in self.kb.countries.values()],
            "currency": [c.currency for c in self.kb.countries.values()],
        }[last]
        wrong = [x for x in pool if x.lower() != task.answer.lower()]
        return queries, rng.choice(wrong) if wrong else queries[-1]
