"""What a worker and its parent say to each other (workers/messages.py): one Struct per kind,
each crossing a multiprocessing pipe and a Ray call (cloudpickle) intact."""

from __future__ import annotations

import gc
import pickle
from multiprocessing.reduction import ForkingPickler

import cloudpickle
import msgspec
import pytest

from batchrun.job.journal import encode_body
from batchrun.openai.records import CHAT, Outcome, Request
from batchrun.workers import messages
from batchrun.workers.messages import (
    Add,
    Cache,
    Eof,
    Fatal,
    Heartbeat,
    Message,
    MessageKind,
    PollReply,
    Ready,
    Restart,
    Results,
    Stats,
    Stop,
    Window,
)

REQUEST = Request(custom_id="r1", line=1, url=CHAT, body={"messages": [{"role": "user"}]})
OUTCOME = Outcome(custom_id="r1", ok=True, status_code=200, body=encode_body({"id": "x"}))
EXAMPLES: list[Message] = [
    Add([REQUEST]),
    Window(64),
    Stop(),
    Ready(
        pid=12,
        start_s=1.5,
        peak_memory_mb=300.0,
        kv_cache=(4096, 16),
        sampling_defaults={"temperature": 0.6},
        timeline={"ready": 1.0},
    ),
    Ready(pid=13, start_s=2.0, node="192.0.2.1", gpus=["0", "1"]),
    Results([OUTCOME]),
    Cache(queries=30, hits=12),
    Stats(peak_memory_mb=512.0, window=8, gpu_memory_mb=[1000.0]),
    Heartbeat(1.0),
    Restart("it cannot abort"),
    Fatal(oom=True, message="OutOfMemoryError", traceback="...", stops_job=False),
    Eof(),
]


def test_each_kind_is_one_message_struct() -> None:
    structs = [
        c
        for c in vars(messages).values()
        if isinstance(c, type) and issubclass(c, Message) and c is not Message
    ]
    assert sorted(c.kind.value for c in structs) == sorted(k.value for k in MessageKind)
    assert {type(m).kind for m in EXAMPLES} == set(MessageKind)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_a_message_crosses_a_pipe_and_a_ray_call_intact(message: Message) -> None:
    piped = pickle.loads(bytes(ForkingPickler.dumps(message)))
    assert piped == message and type(piped) is type(message) and piped.kind is message.kind
    assert cloudpickle.loads(cloudpickle.dumps(message)) == message


def test_a_poll_reply_crosses_a_ray_call_intact() -> None:
    reply = PollReply([OUTCOME], fatal=Fatal(oom=False, message="lost"), cache=Cache(1, 0))
    back = cloudpickle.loads(cloudpickle.dumps(reply))
    assert back == reply and type(back.outcomes[0].body) is msgspec.Raw


def test_messages_are_frozen_and_not_tracked_by_the_garbage_collector() -> None:
    # Results arrive tens of thousands a second: the cyclic collector need not walk them.
    assert not any(gc.is_tracked(m) for m in EXAMPLES)
    with pytest.raises(AttributeError):
        Window(4).size = 8  # type: ignore[misc]
