"""A rank's codec ops on the Rust state, passing over the gradients as few times as DDP does.

Each payload is written where its allreduce sends it and decoded where it arrives.
"""

import torch

from syncopate import NonFiniteError, NonFiniteGradient
from syncopate.torch.device import first_non_finite
from syncopate.torch.link import Lane
from syncopate.torch.schedule import exchange_of, is_identity, is_summed


class Codecs:
    """Runs compensate, encode, next-round, decode, update-memory and scale-output for each
    piece on `state` (a `syncopate.Rank`); `buffers` and `results` are each group's float32
    gradient and result tensors, `scales` what a group's decoded sum is multiplied by.

    Three shortcuts, none of which changes a payload's bytes or a result:
    - a piece whose first round is an allreduce is encoded straight into the exchange's buffer
      (`staged`), and one without memory from its group buffer (compensating would only copy);
    - an allreduced payload is decoded where it arrived (`deliver`), and for a piece without
      memory straight into its result buffer when the sum needs no scaling;
    - the identity codec (`none` without memory) has no payload of its own: its wire format is
      the float32 elements little-endian, which is how the group buffer holds them on the
      little-endian machines torch runs on, so the group buffer's piece is what gets allreduced
      and the result is the sum times the scale, written in one pass.

    On a CUDA device (`state` a `syncopate.DeviceRank`, whose `on_device` is set) the codec ops
    are the project's CUDA kernels, enqueued on the calling thread's current stream: the
    payloads live in the exchanges' device buffers, and each op's stream first waits for the
    piece's previous op (`after`). Codec steps of the schedule run on a stream of their own
    (`lane`). The finite checks wait for the iteration's end (`check_finite`), so the backward
    pass never waits for them: the identity pieces' of the averaged gradients (every rank sees
    the same sums, so every rank stops), the others' of this rank's compression inputs."""

    def __init__(self, layout, state, link, buffers, results, scales, check, names):
        self.layout = layout
        self.state = state
        self.link = link
        self.buffers = buffers
        self.results = results
        on_cpu = all(b.device.type == "cpu" for b in buffers)
        self.on_device = not on_cpu or state.on_device
        # The CPU state reads and writes host memory: views of the CPU buffers.
        self.arrays = None if self.on_device else [b.numpy() for b in buffers]
        self.result_arrays = None if self.on_device else [r.numpy() for r in results]
        self.cuda = not on_cpu
        self.lane = Lane(buffers[0].device if buffers else torch.device("cpu"))
        # Per piece: its last op's CUDA event, and its payload buffer on a device.
        self.events = {}
        self.payloads = {}
        # (group, span) of the identity pieces averaged since the last check_finite, and the
        # other pieces encoded since.
        self.unchecked = []
        self.encoded = []
        self.scales = scales
        self.check = check
        self.names = names
        self.length = {}
        self.staged = {}
        self.delivered = {}
        self.in_place = {i for i, piece in enumerate(layout.pieces) if is_summed(piece)}
        self.identity = {i for i, piece in enumerate(layout.pieces) if is_identity(piece)}

    def _span(self, piece):
        spec = self.layout.pieces[piece]
        return spec["group"], slice(spec["offset"], spec["offset"] + spec["numel"])

    def after(self, piece):
        """The events a stream must wait for before the piece's next op (its last op's)."""
        event = self.events.get(piece)
        return [] if event is None else [event]

    def stream(self):
        """The calling thread's current CUDA stream, as the raw handle the device state takes."""
        return torch.cuda.current_stream(self.buffers[0].device).cuda_stream if self.cuda else 0

    def run(self, piece, ops, iteration):
        """Runs `ops` on `piece` in order (the schedule's order) in `iteration`; on a CUDA
        device, enqueued on the current stream, which must wait for `after(piece)` first."""
        # The identity pieces have no codec work of the device state's.
        if self.on_device and piece not in self.identity:
            self._run_on_device(piece, ops, iteration)
        else:
            self._run_on_host(piece, ops, iteration)
        if self.cuda:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.buffers[0].device))
            self.events[piece] = event

    def _run_on_host(self, piece, ops, iteration):
        state = self.state
        written = False
        for op in ops:
            if op == "compensate":
                self._compensate(piece, iteration)
            elif op == "encode":
                self._encode(piece, iteration)
            elif op == "next-round":
                self._take_delivered(piece)
                self.length[piece] = state.next_round(piece)
            elif op == "decode":
                written = self._decode(piece, iteration)
            elif op == "update-memory":
                state.update_memory(piece)
            elif op == "scale-output":
                state.scale_output(piece)
        if "decode" in ops and not written:
            group, _ = self._span(piece)
            state.write_result(piece, self.result_arrays[group], self.scales[group])
            if self.check is not None:
                self.check.result(piece, iteration)

    def _run_on_device(self, piece, ops, iteration):
        state, stream = self.state, self.stream()
        group, span = self._span(piece)
        for op in ops:
            if op == "compensate":
                state.compensate(piece, self.buffers[group], stream)
                if self.check is not None and iteration < self.check.iterations:
                    self.check.input(piece, iteration, self._values(piece, result=False))
            elif op == "encode":
                out = self.link.buffers.get("payload", piece, state.wire_bytes(piece))
                length = state.encode(piece, out, stream)
                self.payloads[piece] = out
                self.staged[piece] = out[:length]
                self.length[piece] = length
                self.encoded.append(piece)
            elif op == "next-round":
                payload, reduced = self.payloads[piece], self.delivered.pop(piece)
                if reduced.data_ptr() != payload.data_ptr():
                    payload[: reduced.numel()].copy_(reduced)
                length = state.next_round(piece, payload, stream)
                self.staged[piece] = payload[:length]
                self.length[piece] = length
            elif op == "decode":
                last, _ = exchange_of(self.layout.pieces[piece]["rounds"][-1])
                state.decode(piece, self.delivered.pop(piece), self.link.world if last == "allgather" else 1, stream)
            elif op == "update-memory":
                state.update_memory(piece, stream)
            elif op == "scale-output":
                state.scale_output(piece, stream)
        if "decode" in ops:
            state.write_result(piece, self.results[group], self.scales[group], stream)
            # Every rank checks the sums: a rank's bad input may reach them all.
            self.unchecked.append((group, span))
            if self.check is not None and iteration < self.check.iterations:
                self.check.result(piece, iteration, self._values(piece, result=True))

    def _values(self, piece, result):
        """A copy of the piece's last compression input or decoded sum, on the device."""
        values = torch.empty(self.layout.pieces[piece]["numel"], dtype=torch.float32, device=self.buffers[0].device)
        self.state.copy_values(piece, values, result, self.stream())
        return values

    def deliver(self, piece, buffer):
        """The exchange left the summed payload in `buffer` (None: in the state already)."""
        if buffer is not None:
            self.delivered[piece] = buffer

    def _take_delivered(self, piece):
        delivered = self.delivered.pop(piece, None)
        if delivered is not None:
            self.state.set_payload(piece, delivered.numpy())

    # The ops.

    def _no_memory(self, piece):
        return self.layout.pieces[piece]["memory"] == "none"

    def _compensate(self, piece, iteration):
        if piece in self.in_place and self._no_memory(piece):
            # Its encode reads the group buffer itself (and checks it is finite).
            return
        group, _ = self._span(piece)
        self._named(piece, iteration, lambda: self.state.compensate(piece, self.arrays[group]))
        if self.check is not None:
            self.check.input(piece, iteration)

    def _encode(self, piece, iteration):
        if piece not in self.in_place:
            self.length[piece] = self.state.encode(piece)
            return
        group, span = self._span(piece)
        if piece in self.identity:
            if self.on_device:
                self.unchecked.append((group, span))
            else:
                self._named(piece, iteration, lambda: self.state.check_finite(piece, self.arrays[group]))
            out = self.buffers[group][span].view(torch.uint8)
        else:
            out = self.link.buffers.get("allreduce", piece, self.layout.pieces[piece]["rounds"][0]["bytes"])
            source = self.arrays[group] if self._no_memory(piece) else None
            self._named(piece, iteration, lambda: self.state.encode(piece, out.numpy(), source))
        if self._no_memory(piece) and self.check is not None:
            self.check.input(piece, iteration, self.buffers[group][span])
        self.staged[piece] = out
        self.length[piece] = out.numel()

    def _decode(self, piece, iteration):
        """Decodes the piece; True when the result buffer holds its result already."""
        delivered = self.delivered.pop(piece, None)
        group, span = self._span(piece)
        if piece in self.identity and delivered is not None:
            total = delivered.view(torch.float32)
            torch.mul(total, self.scales[group], out=self.results[group][span])
            if self.check is not None:
                self.check.result(piece, iteration, total)
            return True
        if delivered is not None and self._no_memory(piece) and self.scales[group] == 1.0:
            self.state.decode(piece, delivered.numpy(), self.result_arrays[group])
            if self.check is not None:
                self.check.result(piece, iteration, self.results[group][span])
            return True
        self.state.decode(piece, None if delivered is None else delivered.numpy())
        return False

    def check_finite(self, iteration):
        """On a device, raises NonFiniteGradient naming the first non-finite element of the
        iteration's averaged gradients (one read from the device when they are finite); on the
        CPU each encode checked its own rank's gradient before sending it. The device state's
        encodes are checked here too, each of this rank's compression input."""
        encoded, self.encoded = self.encoded, []
        for piece in encoded:
            self._named(piece, iteration, lambda p=piece: self.state.check_finite(p, self.stream()))
        if not self.unchecked:
            return
        spans = self.unchecked
        if bool(torch.stack([torch.isfinite(self.results[g][span]).all() for g, span in spans]).all()):
            self.unchecked = []
            return
        # Kept: the iteration stays failed for whoever finishes it again (close, flush).
        group, element = first_non_finite(self.results, spans)
        value = float(self.results[group][element])
        raise NonFiniteGradient(f"averaged {self._tensor_in(group, element)}: non-finite value {value}, a rank's "
                                f"gradient was not finite (rank {self.link.rank}, iteration {iteration})")

    def _named(self, piece, iteration, body):
        """Runs `body`; a non-finite gradient element is reported with its tensor's name."""
        try:
            return body()
        except NonFiniteError as err:
            message, element = err.args
            raise NonFiniteGradient(
                f"{self._tensor_at(piece, element)}: {message} (rank {self.link.rank}, iteration {iteration})"
            ) from err

    def _tensor_at(self, piece, element):
        spec = self.layout.pieces[piece]
        return self._tensor_in(spec["group"], spec["offset"] + element)

    def _tensor_in(self, group, at):
        """The gradient element at `at` in `group`'s buffer, named."""
        for slot in self.layout.buffers[group]["slots"]:
            if slot["offset"] <= at < slot["offset"] + slot["numel"]:
                return f"gradient of {self.names[slot['tensor']]} (element {at - slot['offset']})"
        return f"group {group} (element {at})"
