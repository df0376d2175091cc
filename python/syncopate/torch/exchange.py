"""One round's exchange of a piece's payload over torch.distributed.

It is started asynchronously and finished later into the rank's codec state (or, for an allreduce,
left in its buffer for the decode to read).
"""

import torch
import torch.distributed as dist

from syncopate.errors import PeerFailure

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def send_sized(link, payload, peer, tag):
    """Starts sending `payload` (uint8) to `peer` as `receive_sized` takes it; returns the launches."""
    size = torch.tensor([payload.numel()], dtype=torch.int64)
    return [link.start(dist.isend, size, peer, tag=tag), link.start(dist.isend, payload, peer, tag=tag + 1)]


def receive_sized(link, peer, tag, what):
    """A message of any length from `peer`: its length (tag `tag`), then its bytes (`tag + 1`)."""
    size = torch.zeros(1, dtype=torch.int64)
    link.wait(link.start(dist.irecv, size, peer, tag=tag), what)
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    link.wait(link.start(dist.irecv, payload, peer, tag=tag + 1), what)
    return payload


def payload_tensor(state, piece, length):
    """The rank's current payload of `piece` copied into a fresh uint8 tensor."""
    buffer = torch.empty(length, dtype=torch.uint8)
    state.copy_payload(piece, buffer.numpy())
    return buffer


class Allreduce:
    """Every rank's payload summed element-wise in its wire type, in place: in `staged` (bytes)
    when the payload was encoded there, else in a kept buffer it is copied into."""

    def __init__(self, link, state, piece, length, dtype, what, staged=None):
        if length % DTYPES[dtype].itemsize:
            raise PeerFailure(f"{what}: a payload of {length} bytes is not whole {dtype} elements")
        self.link, self.what = link, what
        if staged is None:
            staged = link.buffers.get("allreduce", piece, length)
            state.copy_payload(piece, staged.numpy())
        self.buffer = staged
        self.work = link.start(dist.all_reduce, self.buffer.view(DTYPES[dtype]), async_op=True)

    def finish(self):
        """The summed payload's buffer."""
        self.link.wait(self.work, self.what)
        return self.buffer


class HierarchicalAllreduce:
    """The summed payload as the plan prices it: a reduce-scatter inside each node, an allreduce
    of the node's shard across nodes (one rank per node), an all-gather inside the node, each on
    a process group of its own (`Link.with_nodes`). Only the shard crosses nodes."""

    def __init__(self, link, state, piece, length, dtype, what, staged=None):
        self.link, self.what, self.length = link, what, length
        self.scattered = ReduceScatter(link.node, state, piece, length, dtype, f"{what}: reduce-scatter inside the node", staged)

    def finish(self):
        """The summed payload's buffer."""
        scattered, across, node = self.scattered, self.link.across, self.link.node
        scattered.finish()
        across.wait(across.start(dist.all_reduce, scattered.shard, async_op=True), f"{self.what}: allreduce across nodes")
        whole = scattered.padded.view(scattered.dtype)
        node.wait(node.start(dist.all_gather_into_tensor, whole, scattered.shard, async_op=True),
                  f"{self.what}: all-gather inside the node")
        return scattered.padded[: self.length]


class CompressedRing:
    """HiPress's CaSync-Ring over point-to-point messages: at each of the n − 1 hops a rank
    sends its encoding of one shard to the next rank, and the Rust state decodes the shard the
    previous rank sent, adds its own and re-encodes the sum; then the summed shards go round
    as they are. Each message is its length, then its bytes (a payload's length may depend on
    the data)."""

    def __init__(self, link, state, piece, what):
        self.link, self.state, self.piece, self.what = link, state, piece, what

    def finish(self):
        link, state, piece = self.link, self.state, self.piece
        after, before = (link.rank + 1) % link.world, (link.rank - 1) % link.world
        for phase in ("hop", "pass"):
            for step in range(link.world - 1):
                what = f"{self.what}: ring {phase} {step}"
                tag = link.next_tag()
                out = torch.frombuffer(bytearray(state.ring_outgoing(piece, phase, step)), dtype=torch.uint8)
                sends = send_sized(link, out, after, tag)
                incoming = receive_sized(link, before, tag, f"{what} from rank {before}")
                for send in sends:
                    link.wait(send, f"{what} to rank {after}")
                state.ring_take(piece, phase, step, incoming.numpy())


class ReduceScatter:
    """DeAR's first half, and the hierarchical allreduce's: each rank ends with the sum of its
    shard of the payload (padded to whole shards, in `padded`); the shard waits for the
    all-gather half. The payload is copied from the state, or from `staged` (bytes) when it was
    encoded there."""

    def __init__(self, link, state, piece, length, dtype, what, staged=None):
        element = DTYPES[dtype].itemsize
        if length % element:
            raise PeerFailure(f"{what}: a payload of {length} bytes is not whole {dtype} elements")
        self.link, self.what = link, what
        self.count = length // element
        chunk = -(-self.count // link.world)
        self.padded = link.buffers.get("reduce-scatter input", piece, chunk * link.world * element)
        if staged is None:
            state.copy_payload(piece, self.padded[:length].numpy())
        else:
            self.padded[:length].copy_(staged)
        self.padded[length:].zero_()
        self.dtype = DTYPES[dtype]
        self.shard = link.buffers.get("reduce-scatter shard", piece, chunk, self.dtype)
        self.work = link.start(dist.reduce_scatter_tensor, self.shard, self.padded.view(self.dtype), async_op=True)

    def finish(self):
        self.link.wait(self.work, self.what)


class AllgatherShards:
    """DeAR's second half: the summed shards to every rank, the payload whole again."""

    def __init__(self, link, state, piece, scattered, what):
        self.link, self.state, self.piece, self.what = link, state, piece, what
        self.scattered = scattered
        self.full = link.buffers.get("all-gathered shards", piece, scattered.shard.numel() * link.world, scattered.dtype)
        self.work = link.start(dist.all_gather_into_tensor, self.full, scattered.shard, async_op=True)

    def finish(self):
        """The summed payload's buffer."""
        self.link.wait(self.work, self.what)
        return self.full[: self.scattered.count].view(torch.uint8)


class Allgather:
    """Every rank's payload to every rank. Gloo gathers equal sizes only: the sizes are
    exchanged first (started at launch, so a launch never blocks) and the payloads, padded to
    the largest, at finish."""

    def __init__(self, link, state, piece, length, what):
        self.link, self.state, self.piece, self.length, self.what = link, state, piece, length, what
        self.sizes = link.start_lengths(length)

    def finish(self):
        link, piece = self.link, self.piece
        sizes = link.finish_lengths(self.sizes, self.what)
        largest = max(sizes)
        mine = link.buffers.get("allgather input", piece, largest)
        self.state.copy_payload(piece, mine[: self.length].numpy())
        mine[self.length :].zero_()
        gathered = [link.buffers.get(f"allgathered from rank {r}", piece, largest) for r in range(link.world)]
        link.wait(link.start(dist.all_gather, gathered, mine, async_op=True), self.what)
        self.state.set_gathered(piece, [g[:n].numpy() for g, n in zip(gathered, sizes)])


class GatheredPayloads:
    """Every rank's payload to every rank, when every payload has the same length (the device
    codecs' are fixed by the piece): one all-gather of `staged` (bytes) into a buffer of the
    payloads in rank order."""

    def __init__(self, link, piece, staged, what):
        self.link, self.what = link, what
        self.gathered = link.buffers.get("allgathered payloads", piece, staged.numel() * link.world)
        self.work = link.start(dist.all_gather_into_tensor, self.gathered, staged, async_op=True)

    def finish(self):
        """The gathered payloads' buffer."""
        self.link.wait(self.work, self.what)
        return self.gathered


class PushPullMessages:
    """A parameter server's messages, as ps-lite sends a key/value's metadata apart from its
    data: every worker sends its payload's length and then the payload to the server (at
    launch); at finish the server receives them from each peer in rank order, makes the payload
    every worker pulls, and sends its length and bytes back to each."""

    def __init__(self, link, payload, server, what):
        self.link, self.payload, self.server, self.what = link, payload, server, what
        self.tag = link.next_tag()
        self.sends = []
        if link.rank != server:
            self.sends = send_sized(link, payload, server, self.tag)

    def finish(self, serve):
        """A worker's pulled payload; on the server, `serve(every rank's pushed payload, in
        rank order)` makes the payload the workers pull, which is returned."""
        link = self.link
        if link.rank != self.server:
            for send in self.sends:
                link.wait(send, f"{self.what}: push to server rank {self.server}")
            return receive_sized(self.link, self.server, self.tag + 2, f"{self.what}: pull from server rank {self.server}")
        pushed = [
            self.payload if peer == link.rank else receive_sized(self.link, peer, self.tag, f"{self.what}: push from rank {peer}")
            for peer in range(link.world)
        ]
        pulled = serve(pushed)
        sends = [send for peer in range(link.world) if peer != link.rank for send in send_sized(link, pulled, peer, self.tag + 2)]
        for send in sends:
            link.wait(send, f"{self.what}: pull by a worker")
        return pulled


class PushPull:
    """Parameter server over point-to-point messages: every worker pushes its payload to the
    piece's server rank, which decodes, sums and re-encodes (the Rust codecs), then every worker
    pulls the result. The push is sent at launch; the server's part and the pull run at finish."""

    def __init__(self, link, state, piece, length, server, what):
        self.state, self.piece = state, piece
        self.serving = link.rank == server
        self.messages = PushPullMessages(link, payload_tensor(state, piece, length), server, what)

    def _serve(self, pushed):
        length = self.state.serve(self.piece, [p.numpy() for p in pushed])
        return payload_tensor(self.state, self.piece, length)

    def finish(self):
        pulled = self.messages.finish(self._serve)
        if not self.serving:
            self.state.set_payload(self.piece, pulled.numpy())
