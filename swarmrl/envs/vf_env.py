"""A verifiers (v1, 0.4.0) environment as our ``Environment``: its taskset's tasks as our tasks, its tools run in
this process, its rewards as our reward. Imported only when a ``vf:`` task is built (``swarmrl.envs.vf``).

Loading: ``vf:<env_id>`` is verifiers' own loader on ``<env_id>`` (``taskset_config_type`` / ``load_taskset``: an
installed package ``<env_id>`` exporting its ``Taskset`` subclass in ``__all__``). Params: ``taskset`` (a dict: the
taskset config's fields, as ``--env.taskset.*`` takes them), ``heldout_pct`` (the held-out share, default 10),
``max_tasks`` (tasks read from the taskset, default 10 000: an infinite taskset is cut there), ``max_turns`` (model
turns per episode, default 8), ``max_context_tokens`` (the longest prompt of a model turn, default 8192: an episode
whose next prompt would be longer ends after its last model turn; in the contract, so the validator replays it),
``tool_timeout_s`` (per call of an async tool, default 60: a timeout answers ``error: TimeoutError``, which a
validator's replay may not reproduce: keep tools well inside it).

Tasks: the taskset is read once, in order (the last few read are kept per process); task ``i`` is verifiers' task
``idx = i`` with its ``key`` (content hash or the taskset's own id). The split is ``heldout_bucket`` of the key, so
training never draws a held-out task; ``sample(seed, n, split)`` draws from the split with a seeded
``random.Random``. Our task carries ``idx`` and ``key`` (and, in ``meta``, the chat messages and tool declarations
the prompt is rendered from): the verifier takes the task from the taskset again by ``idx`` and checks the key (a
task file cannot hand it another task's data).

Tools: the task's and the taskset's ``Toolset`` objects (``toolsets(config)``), their ``@vf.tool`` methods called
in this process with arguments validated against their signatures (names ``<server>_<tool>``, as verifiers' MCP
client names them); a tool that raises answers ``error: <type>``. Stateful toolsets (a ``vf.State`` subclass, kept
in a state server) and runtime-bound signals (a reward that needs a sandbox ``runtime``) are not supported here: the
first raises ``ValueError``; the second is skipped by verifiers' own offline scoring. Tools must be deterministic for
the validator's replay to pass.

Reward: verifiers' ``Task.score`` on a ``Trace`` built from the conversation (no runtime), the weighted sum of the
rewards clamped to [0, 1] (non-finite: 0).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import itertools
import json
import math
import random
import threading
from collections import OrderedDict
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import pydantic
import verifiers.v1 as v1
from verifiers.v1.dialects.chat import message_to_wire, parse_message
from verifiers.v1.graph import MessageNode
from verifiers.v1.state import State, state_cls
from verifiers.v1.trace import AgentInfo, TraceTask
from verifiers.v1.utils.decorators import discover_decorated

from swarmrl.envs.base import Environment, Split, Task, VerifierUnavailable, heldout_bucket
from swarmrl.envs.vf import CONVERSATION, PREFIX, TASK_TYPE

Message = dict[str, Any]
T = TypeVar("T")
MAX_TOOL_RESULT_CHARS = 16_384


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end from sync code, also where this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["v"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001  # re-raised in the caller's thread
            box["e"] = e

    t = threading.Thread(target=target, name="vf-sync")
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


class ToolBox:
    """One episode's tools: the OpenAI ``tools`` declarations and the bound methods behind them."""

    def __init__(self, toolsets: Sequence[Any], timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s  # per call of an async tool (a sync one runs to its end)
        self.fns: dict[str, Any] = {}
        self.declarations: list[Message] = []
        for ts in toolsets:
            if state_cls(type(ts)) is not State:
                raise ValueError(f"toolset {type(ts).__name__} keeps state in a state server: not supported here")
            prefix = ts.server_name
            for fn in discover_decorated(ts, "tool"):
                name = getattr(fn, "tool_name", None) or fn.__name__
                full = f"{prefix}_{name}" if prefix else name
                if full in self.fns:
                    raise ValueError(f"two tools named {full!r}")
                schema = pydantic.TypeAdapter(fn).json_schema()
                self.fns[full] = fn
                self.declarations.append({"type": "function", "function": {
                    "name": full, "description": (fn.__doc__ or "").strip(), "parameters": schema}})

    async def call(self, name: str, arguments: str) -> str:
        fn = self.fns.get(name)
        if fn is None:
            return f"error: no tool named {name[:100]!r}"
        try:
            args = json.loads(arguments) if arguments.strip() else {}
            if not isinstance(args, dict):
                return "error: the arguments must be a JSON object"
            result = pydantic.validate_call(fn)(**args)
            if inspect.isawaitable(result):
                result = await asyncio.wait_for(result, self.timeout_s)
        except Exception as e:  # noqa: BLE001  # the model's call failed: that is the tool's answer
            return f"error: {type(e).__name__}"
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        return text[:MAX_TOOL_RESULT_CHARS]


_LOADED: OrderedDict[tuple, tuple[Any, list[Any]]] = OrderedDict()  # the last few tasksets read (workers and
_LOADED_MAX = 4  # validators build the same task for every batch; reading a big taskset again would cost seconds)
_LOAD_LOCK = threading.Lock()


def _load(env_id: str, params_json: str, max_tasks: int) -> tuple[Any, list[Any]]:
    """The taskset and its first ``max_tasks`` tasks (cached by the arguments)."""
    key = (env_id, params_json, max_tasks)
    with _LOAD_LOCK:
        if key in _LOADED:
            _LOADED.move_to_end(key)
            return _LOADED[key]
        try:
            cfg_cls = v1.taskset_config_type(env_id)
            taskset = v1.load_taskset(cfg_cls.model_validate({**json.loads(params_json), "id": env_id}))
        except (ModuleNotFoundError, AttributeError, TypeError) as e:
            raise ValueError(f"verifiers environment {env_id!r} could not be loaded: {e}") from None
        tasks = list(itertools.islice(iter(taskset), max_tasks))
        keys = [t.key for t in tasks]
        if len(set(keys)) != len(keys):
            raise ValueError(f"verifiers environment {env_id!r} has tasks with the same key")
        _LOADED[key] = (taskset, tasks)
        while len(_LOADED) > _LOADED_MAX:
            _LOADED.popitem(last=False)
        return taskset, tasks


class VerifiersEnv(Environment):
    """``vf:<env_id>``: see the module docstring. Its episodes and their replay: ``swarmrl.episodes.vf``."""

    task_type = TASK_TYPE

    def __init__(self, env_id: str, taskset: dict[str, Any] | None = None, heldout_pct: float = 10.0,
                 max_tasks: int = 10_000, max_turns: int = 8, max_context_tokens: int = 8192,
                 tool_timeout_s: float = 60.0) -> None:
        if not 0 <= heldout_pct < 100:
            raise ValueError(f"heldout_pct must be in [0, 100), not {heldout_pct}")
        if max_tasks < 1 or max_turns < 1 or max_context_tokens < 1:
            raise ValueError("max_tasks, max_turns and max_context_tokens must be at least 1")
        self.env_id, self.name = env_id, PREFIX + env_id
        self.max_turns, self.max_context_tokens = max_turns, max_context_tokens
        self.tool_timeout_s = tool_timeout_s
        self.taskset, self.tasks = _load(env_id, json.dumps(taskset or {}, sort_keys=True), max_tasks)
        keys = [t.key for t in self.tasks]
        self._split: dict[str, list[int]] = {"train": [], "heldout": []}
        for i, k in enumerate(keys):
            self._split["heldout" if heldout_bucket(f"{self.name}:{k}", heldout_pct) else "train"].append(i)

    # ---- tasks ----------------------------------------------------------------------------------------------
    def _ours(self, i: int) -> Task:
        t = self.tasks[i]
        tools = self._toolbox(t).declarations or None
        return Task(task_id=f"{self.name}:{t.key[:32]}", env=self.name, prompt=t.data.prompt_text,
                    verification_info={"idx": i, "key": t.key}, task_type=TASK_TYPE,
                    meta={"messages": self._initial(t), "tools": tools})

    def sample(self, seed: int, n: int, split: Split = "train") -> list[Task]:
        pool = self._split[split]
        if not pool:
            raise ValueError(f"{self.name} has no {split} tasks ({len(self.tasks)} tasks in all)")
        rng = random.Random(int.from_bytes(hashlib.blake2b(f"{self.name}|{seed}".encode(), digest_size=8).digest(),
                                           "big"))
        picks = rng.sample(pool, n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]
        return [self._ours(i) for i in picks]

    def vf_task(self, task: Task) -> Any:
        """The verifiers task behind ``task``, re-read by ``idx`` and checked against its key (ValueError)."""
        info = task.verification_info
        i = info.get("idx")
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.tasks):
            raise ValueError(f"task {task.task_id}: bad idx {i!r}")
        if self.tasks[i].key != info.get("key"):
            raise ValueError(f"task {task.task_id}: its key is not task {i}'s")
        return self.tasks[i]

    @staticmethod
    def _initial(t: Any) -> list[Message]:
        out: list[Message] = []
        if t.data.system_prompt:
            out.append({"role": "system", "content": t.data.system_prompt})
        prompt = t.data.prompt
        if isinstance(prompt, str):
            out.append({"role": "user", "content": prompt})
        elif prompt:
            out += [message_to_wire(m) for m in prompt]
        return out

    def initial_messages(self, task: Task) -> list[Message]:
        return self._initial(self.vf_task(task))

    def tools(self, task: Task) -> ToolBox:
        """A fresh episode's tools (the task's toolsets, then the taskset's)."""
        return self._toolbox(self.vf_task(task))

    def _toolbox(self, t: Any) -> ToolBox:
        return ToolBox([*type(t).toolsets(t.config), *type(self.taskset).toolsets(self.taskset.config)],
                       self.tool_timeout_s)

    # ---- reward ---------------------------------------------------------------------------------------------
    async def ascore(self, task: Task, messages: Sequence[Message]) -> float:
        """The reward of a conversation (the initial messages, then the episode's): verifiers' offline scoring."""
        t = self.vf_task(task)
        trace = v1.Trace(task=TraceTask(type=type(t).__name__, data=t.data, key=t.key, hash=t.hash),
                         state=state_cls(type(t))(), agent=AgentInfo(config=v1.AgentConfig(), name="swarmrl"))
        n0 = len(self._initial(t))
        for k, m in enumerate(messages):
            msg = parse_message(dict(m))
            trace.nodes.append(MessageNode(parent=k - 1 if k else None, message=msg,
                                           sampled=k >= n0 and m.get("role") == "assistant"))
        trace.is_completed = trace.ok = True
        await t.score(trace, None)
        r = trace.reward
        return min(1.0, max(0.0, r)) if math.isfinite(r) else 0.0

    def score_messages(self, task: Task, messages: Sequence[Message]) -> float:
        try:
            self.vf_task(task)
        except ValueError:
            return 0.0  # the row's task is not ours: nothing to score
        try:
            return run_sync(self.ascore(task, messages))
        except Exception as e:
            if self.strict:
                raise VerifierUnavailable(f"{self.name}: scoring failed: {type(e).__name__}: {e}") from e
            return 0.0

    def verify(self, task: Task, completion: str) -> float:
        """The reward of ``completion``: one assistant reply, or (``conversation_text``) an episode's messages."""
        try:
            msgs = self.initial_messages(task)
        except ValueError:
            return 0.0
        if not completion.startswith(CONVERSATION):
            return self.score_messages(task, [*msgs, {"role": "assistant", "content": completion}])
        try:
            tail = json.loads(completion[len(CONVERSATION):])
        except ValueError:
            return 0.0
        if not isinstance(tail, list) or not all(isinstance(m, dict) and m.get("role") in ("assistant", "tool")
                                                 for m in tail):
            return 0.0
        return self.score_messages(task, [*msgs, *tail])


def conversation_text(initial: Sequence[Message], messages: Sequence[Message]) -> str:
    """What ``verify`` scores for an episode: its messages after the ``initial`` ones."""
    return CONVERSATION + json.dumps(list(messages[len(initial):]), sort_keys=True)
