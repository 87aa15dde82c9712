"""The chat tokenizer: an offline-built default in the transformers format, and the wrapper agents use.

Two halves:

- **Build** (``build_tokenizer``; CLI ``scripts/build_tokenizer.py``; ``ensure_default_tokenizer`` builds on
  first use). A byte-level BPE trained with the ``tokenizers`` library on text from every env plus every env's
  demonstration conversations rendered through ``CHAT_TEMPLATE`` (so the scaffolding the model sees most gets
  the merges). Digits are split one per token so arithmetic stays learnable. Deterministic: same inputs, same
  files, same ``tokenizer_hash``. Saved with ``save_pretrained``, so ``AutoTokenizer.from_pretrained(path)``
  loads it offline like any Hugging Face tokenizer.
- **Use** (``load_tokenizer`` -> ``ChatTokenizer``). Works for our default and for a real model's own
  tokenizer directory. It renders the initial prompt, and renders ONE later message (a tool result or env
  feedback) on its own so the episode runner can extend the token list incrementally instead of re-rendering
  the conversation (token-in/token-out, see ``pipelines_lib/agents/episode.py``).

The chat template is Qwen/Hermes ChatML: ``<|im_start|>role\\n...<|im_end|>\\n`` with roles system, user,
assistant and tool; tool schemas in the system turn inside ``<tools>``; assistant tool calls inline as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the text the model generates, kept verbatim in the
message content); tool results as ``<|im_start|>tool\\n<tool_response>...</tool_response><|im_end|>\\n``, one
block per result so each can be rendered alone. The template is kept terse (compact tool JSON, no instructions)
because the tiny campaign's whole episode must fit 192 tokens; a perfect arithmetic episode takes about 150.
Control tokens inside message content (a tool printing ``<|im_end|>``) are encoded as plain text, so only the
template writes turn boundaries and markup.

The turn separator: the template closes every turn with ``<|im_end|>\\n`` but generation stops at
``<|im_end|>``, so the ``\\n`` after a generated turn is never sampled. ``render_message_ids`` therefore starts
with that separator: concatenating prompt, generated turns and rendered messages gives exactly the template's
text for the whole conversation.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

BUILD_VERSION = "4"
"""Bump when the recipe changes: the default cache directory is keyed by it, so stale builds are not reused.
The key does not cover the env texts: after changing them, bump it (or delete the cache) to retrain."""

_IMPORT_LOCK = threading.Lock()
"""transformers resolves its top-level names lazily, and two threads doing so at once (rollout workers and the
trainer run as threads of one process) can fail with "cannot import name 'PreTrainedTokenizerFast'"."""


def _transformers(name: str) -> Any:
    with _IMPORT_LOCK:
        import transformers

        return getattr(transformers, name)

DEFAULT_VOCAB_SIZE = 512
"""``ModelConfig.tiny().vocab_size``: every id, special tokens included, is below it."""

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END)
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Single ids for the tool markup, but not "special": they stay in decoded text so parsers can see them."""

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
)
"""Files that define a tokenizer; ``tokenizer_hash`` covers those present (weights next to them are not)."""

CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system = messages[0].content %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}"
    "{%- if system or tools %}"
    "{{- '<|im_start|>system\\n' + system }}"
    "{%- if tools %}"
    "{%- if system %}{{- '\\n' }}{%- endif %}"
    "{{- '<tools>' }}"
    "{%- for tool in tools %}"
    "{{- '\\n' + ((tool.function if tool.function is defined else tool) | tojson(separators=(',', ':'))) }}"
    "{%- endfor %}"
    "{{- '\\n</tools>' }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>' + message.content + '</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

Message = Mapping[str, Any]
ToolSchema = Mapping[str, Any]

RENDER_CACHE_SIZE = 4096
"""Template renderings ``ChatTokenizer.render_ids`` keeps (least recently used dropped first)."""
_DUMMY_EXCHANGE = ({"role": "user", "content": "?"}, {"role": "assistant", "content": "!"})


def default_tokenizer_dir(cache_root: str | os.PathLike[str] | None = None) -> Path:
    """``<cache_root>/tokenizer/default-v<BUILD_VERSION>-<vocab>``.

    ``cache_root`` is the process's cache folder (``Settings.cache``, set by ``ROLLSTREAM_CACHE``); it defaults
    to the repository's ``build/`` folder.
    """
    if cache_root is None:
        cache_root = Path(__file__).resolve().parents[2] / "build"
    return Path(cache_root) / "tokenizer" / f"default-v{BUILD_VERSION}-{DEFAULT_VOCAB_SIZE}"


def ensure_default_tokenizer(path: str | os.PathLike[str] | None = None) -> Path:
    """The default tokenizer's directory, built there first if it is missing (safe under concurrent callers)."""
    out = Path(path) if path is not None else default_tokenizer_dir()
    if not (out / "tokenizer.json").exists():
        build_tokenizer(out)
    return out


def default_training_texts(seed: int = 0, *, n_per_env: int = 200) -> Iterable[str]:
    """What the default tokenizer is trained on: every env's corpus text, plus ``n_per_env`` demonstrations per
    env rendered through ``CHAT_TEMPLATE`` with the env's tools, so the scaffolding every prompt repeats (system
    prompt, tool schemas, role headers) is weighted as often as the model will read it."""
    from tokenizers import Tokenizer, models

    from pipelines_lib.envs import ENV_REGISTRY
    from pipelines_lib.envs.corpus import all_text_for_tokenizer

    yield from all_text_for_tokenizer(seed)
    # Rendering text needs a tokenizer object but not a trained one.
    renderer = _transformers("PreTrainedTokenizerFast")(
        tokenizer_object=Tokenizer(models.BPE()), chat_template=CHAT_TEMPLATE
    )
    for name in sorted(ENV_REGISTRY):
        env = ENV_REGISTRY[name]()
        tools = [t.schema() for t in env.tools().values()] or None
        for task in ENV_REGISTRY[name].generate_tasks(seed=seed, n=n_per_env, split="train"):
            yield renderer.apply_chat_template(env.demonstration(task, seed=seed), tools=tools, tokenize=False)


def build_tokenizer(
    out_dir: str | os.PathLike[str],
    *,
    texts: Iterable[str] | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
) -> Path:
    """Train and save the default tokenizer into ``out_dir`` (create-only: an existing build is kept).

    ``texts`` defaults to ``default_training_texts(seed)``. Written to a temporary sibling and renamed, so a
    crashed or concurrent build never leaves a half-written directory behind.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    n_reserved = len(SPECIAL_TOKENS) + len(MARKUP_TOKENS)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < n_reserved + len(alphabet):
        raise ValueError(f"vocab_size must be >= {n_reserved + len(alphabet)} (bytes + special tokens), got {vocab_size}")
    corpus = list(default_training_texts(seed) if texts is None else texts)
    if not corpus:
        raise ValueError("build_tokenizer: no training text")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *MARKUP_TOKENS],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # Training them as special tokens keeps BPE from spending merges on their text; afterwards the markup is made
    # ordinary (non-special) so decoding never drops it.
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] in SPECIAL_TOKENS
    tok = Tokenizer.from_str(json.dumps(spec))
    hf = _transformers("PreTrainedTokenizerFast")(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        chat_control_tokens=[*SPECIAL_TOKENS, *MARKUP_TOKENS],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        hf.save_pretrained(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "tokenizer.json").exists():
                raise
            # Another process finished the same deterministic build first; keep its files.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def tokenizer_files_hash(path: str | os.PathLike[str]) -> str:
    """sha256 over the names and bytes of the tokenizer files present in ``path`` (``TOKENIZER_FILES``)."""
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        f = Path(path) / name
        if f.exists():
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


class ChatTokenizer:
    """A Hugging Face tokenizer plus the chat rendering the episode runner needs.

    All ids are plain ``list[int]``; text is encoded without adding BOS/EOS (the template writes what it wants).
    """

    def __init__(self, hf: Any, *, tokenizer_hash: str) -> None:
        self.hf = hf
        self.tokenizer_hash = tokenizer_hash
        self._render_cached = functools.lru_cache(maxsize=RENDER_CACHE_SIZE)(self._render)
        stops = [hf.convert_tokens_to_ids(t) for t in (IM_END, hf.eos_token) if t is not None]
        unk = hf.unk_token_id
        self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in stops if i is not None and i != unk))
        """Ids that end an assistant turn (generation stops after emitting one)."""
        if not self.stop_ids:
            raise ValueError("tokenizer has neither <|im_end|> nor an eos token; cannot end assistant turns")
        self.pad_id: int = hf.pad_token_id if hf.pad_token_id is not None else self.stop_ids[0]
        # render_message_ids cuts one message out of a dummy exchange; its ids and where the assistant's turn is
        # closed are fixed, so they are computed once.
        self._exchange_ids = self.render_ids(_DUMMY_EXCHANGE)
        closed = [i for i, t in enumerate(self._exchange_ids) if t in self.stop_ids]
        if not closed:
            raise ValueError("chat template does not close an assistant turn with a stop id")
        self._exchange_closed = closed[-1]

    def __getstate__(self) -> dict[str, Any]:
        # The memo of renderings is a cache bound to this object: a copy (pickled to another process) starts empty.
        return {k: v for k, v in self.__dict__.items() if k != "_render_cached"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._render_cached = functools.lru_cache(maxsize=RENDER_CACHE_SIZE)(self._render)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (every id is below it)."""
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_text(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSchema] | None = None, add_generation_prompt: bool = False
    ) -> str:
        """The chat template's text for ``messages`` (tool schemas as ``Tool.schema()`` returns them)."""
        return self.hf.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def render_ids(
        self, messages: Sequence[Message], *, tools: Sequence[ToolSchema] | None = None, add_generation_prompt: bool = False
    ) -> list[int]:
        """Ids of the template's rendering, with control tokens inside message content encoded as plain text.

        So a tool result (or any env text) that contains ``<|im_end|>`` or ``<tool_call>`` cannot forge a turn
        boundary or a tool call: only the template itself writes control tokens.

        Renderings are memoised by content (``RENDER_CACHE_SIZE`` of them): every sample of a group starts from
        the same prompt and every episode of an env from the same system turn, and a template rendering costs
        about a millisecond and a half of host time, which rollout shares with the engine.
        """
        # Key order is kept: the template writes tool schemas as JSON in their own order.
        key = json.dumps([[dict(m) for m in messages], [dict(t) for t in tools or ()], add_generation_prompt])
        return list(self._render_cached(key))

    def _render(self, key: str) -> tuple[int, ...]:
        messages, tools, add_generation_prompt = json.loads(key)
        return tuple(self.hf.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
            sanitize_control_tokens=True,
        ))

    def render_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSchema] | None = None) -> list[int]:
        """Ids of the initial conversation followed by the assistant generation prompt."""
        return self.render_ids(messages, tools=tools, add_generation_prompt=True)

    def render_message_ids(
        self, message: Message, *, add_generation_prompt: bool = True, follows_assistant: bool = True
    ) -> list[int]:
        """Ids of ONE message (tool result or env feedback) appended to a conversation.

        The template's rendering of this message alone, computed as the ids a dummy exchange gains when the
        message is added (so templates that put headers on every conversation work too); preceded, when it
        ``follows_assistant``, by the separator the template puts after the stop id closing an assistant turn
        (generation stops at that id, so the separator is never sampled); followed, by default, by the assistant
        generation prompt. Several messages in a row: only the first follows the assistant, only the last adds
        the generation prompt.
        """
        full = self.render_ids([*_DUMMY_EXCHANGE, dict(message)], add_generation_prompt=add_generation_prompt)
        if full[: len(self._exchange_ids)] != self._exchange_ids:
            raise ValueError("chat template re-renders earlier turns when a message is added; cannot render incrementally")
        return full[self._exchange_closed + 1 if follows_assistant else len(self._exchange_ids):]

    def encode_conversation(
        self, messages: Sequence[Message], tools: Sequence[ToolSchema] | None = None
    ) -> tuple[list[int], list[int]]:
        """``(ids, loss_mask)`` of a whole conversation laid out exactly as an episode records it.

        The leading non-assistant messages form the prompt; each assistant message is ``encode(content)`` plus
        the stop id (mask 1); every later message is ``render_message_ids`` (mask 0). For supervised warm starts
        on demonstrations, so training sees the same token layout as rollouts.
        """
        n_head = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        ids = self.render_prompt(messages[:n_head], tools)
        mask = [0] * len(ids)
        for k in range(n_head, len(messages)):
            if messages[k]["role"] == "assistant":
                part, bit = [*self.encode(messages[k]["content"]), self.stop_ids[0]], 1
            else:
                part, bit = self.render_message_ids(
                    messages[k],
                    add_generation_prompt=k + 1 < len(messages) and messages[k + 1]["role"] == "assistant",
                    follows_assistant=messages[k - 1]["role"] == "assistant",
                ), 0
            ids += part
            mask += [bit] * len(part)
        return ids, mask


def load_tokenizer(path: str | os.PathLike[str]) -> ChatTokenizer:
    """Load a transformers-format tokenizer directory (ours or a model's) offline."""
    config_file = Path(path) / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    if config.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        # A generic tokenizer.json: load it directly; AutoTokenizer would import torch (seconds) to find the class.
        loader = _transformers("PreTrainedTokenizerFast")
    else:
        loader = _transformers("AutoTokenizer")
    hf = loader.from_pretrained(str(path), local_files_only=True)
    if not getattr(hf, "chat_template", None):
        raise ValueError(f"tokenizer at {path} has no chat_template")
    return ChatTokenizer(hf, tokenizer_hash=tokenizer_files_hash(path))


def tokenizer_dir(path: str | os.PathLike[str] | None, *, cache: str | os.PathLike[str] | None = None) -> Path:
    """The tokenizer folder at ``path``, or the embedded default's when it is None (built on first use under
    ``cache``, the process's cache folder: ``Settings.cache``; None: the repository's ``build/``)."""
    return Path(path) if path is not None else ensure_default_tokenizer(default_tokenizer_dir(cache))


def open_tokenizer(path: str | os.PathLike[str] | None, *, cache: str | os.PathLike[str] | None = None
                   ) -> ChatTokenizer:
    """The tokenizer at :func:`tokenizer_dir` ``(path, cache=cache)``."""
    return load_tokenizer(tokenizer_dir(path, cache=cache))
