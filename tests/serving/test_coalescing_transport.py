"""The server's transport joins a response's header and body writes into one send."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import pytest

from serving.server import CoalescingHttpToolsProtocol, CoalescingTransport


class RecordingTransport:
    """What a transport was asked to do, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", bytes(data)))

    def close(self) -> None:
        self.calls.append(("close", None))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", None))
        self.closing = True

    def write_eof(self) -> None:
        self.calls.append(("write_eof", None))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5)}.get(name, default)


def run_turns(check: Any) -> None:
    """Run ``check(loop)``, then let the loop finish its pending callbacks."""

    async def main() -> None:
        check(asyncio.get_running_loop())
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())


def test_two_writes_in_a_row_leave_in_one_send() -> None:
    inner = RecordingTransport()

    def check(loop: asyncio.AbstractEventLoop) -> None:
        transport = CoalescingTransport(inner, loop)
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
        assert inner.calls == []  # held
        assert transport.get_write_buffer_size() == 7 + 38
        transport.write(memoryview(b"body"))
        assert inner.calls == [("write", b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nbody")]

    run_turns(check)
    assert len(inner.calls) == 1  # the end of the turn sent nothing more


def test_a_lone_write_leaves_at_the_end_of_the_loop_turn() -> None:
    inner = RecordingTransport()
    held: list[CoalescingTransport] = []

    def check(loop: asyncio.AbstractEventLoop) -> None:
        transport = CoalescingTransport(inner, loop)
        held.append(transport)
        transport.write(b"first")
        transport.write(b"second")
        transport.write(b"third")  # held again after a joined send
        assert inner.calls == [("write", b"firstsecond")]

    run_turns(check)
    assert inner.calls == [("write", b"firstsecond"), ("write", b"third")]
    assert held[0].get_write_buffer_size() == 7


def test_closing_sends_what_is_held_first_and_abort_drops_it() -> None:
    closed, aborted, ended = RecordingTransport(), RecordingTransport(), RecordingTransport()

    def check(loop: asyncio.AbstractEventLoop) -> None:
        transport = CoalescingTransport(closed, loop)
        transport.write(b"last words")
        transport.close()
        transport = CoalescingTransport(aborted, loop)
        transport.write(b"never sent")
        transport.abort()
        transport = CoalescingTransport(ended, loop)
        transport.writelines([b"a", b"b", b"c"])
        transport.write_eof()
        assert transport.get_extra_info("peername") == ("127.0.0.1", 5)  # the rest: passed on

    run_turns(check)
    assert closed.calls == [("write", b"last words"), ("close", None)]
    assert aborted.calls == [("abort", None)]
    assert ended.calls == [("write", b"ab"), ("write", b"c"), ("write_eof", None)]


def data_segments_received(sock: socket.socket) -> int:
    """Linux's count of segments with data this socket received (``tcpi_data_segs_in``)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 160)
    return struct.unpack_from("<I", info, 152)[0]


@pytest.mark.parametrize("body_bytes", [0, 11_000])
def test_the_server_protocol_answers_headers_and_body_in_one_segment(body_bytes: int) -> None:
    """A real uvicorn protocol on a real socket: the client receives each whole response
    (headers and an 11 kB body) as one TCP segment; uvicorn's own transport sends two."""
    import uvicorn
    from uvicorn.server import ServerState

    body = b"x" * body_bytes

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    config = uvicorn.Config(app, http=CoalescingHttpToolsProtocol, log_config=None)
    config.load()
    state = ServerState()

    async def main() -> tuple[bytes, int]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: CoalescingHttpToolsProtocol(
                config=config, server_state=state, app_state={}, _loop=loop
            ),
            "127.0.0.1",
            0,
        )
        port = server.sockets[0].getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        client.setblocking(False)
        answers = b""
        try:
            for _ in range(3):
                await loop.sock_sendall(client, b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
                answer = b""
                while not answer.endswith(b"\r\n\r\n" + body):
                    answer += await loop.sock_recv(client, 1 << 20)
                answers += answer
            return answers, data_segments_received(client)
        finally:
            client.close()
            server.close()

    answers, segments = asyncio.run(main())
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert segments == 3
