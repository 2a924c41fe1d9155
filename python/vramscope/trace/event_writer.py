"""Writes a recorded trace in the event-stream format, version 1 (docs/event-stream.md)."""

from .records import category

HEADER = "vramscope-events 1"


def _one_line(text):
    return " ".join(str(text).split())


def write_event_stream(path, meta, strings, events):
    """Writes the trace to `path`; returns the number of bytes written.

    meta: list of (key, value) pairs, written as `meta KEY VALUE`.
    strings: internal string table; strings[i] is the text of internal id i (0 = none).
    events: ("a", AllocRecord) | ("f", AllocRecord) | ("p", step, phase) | ("e",), in order.

    String records are written just before the first event that uses them, numbered
    1, 2, ... in that order, as the format requires.
    """
    lines = [HEADER]
    for key, value in meta:
        lines.append(f"meta {_one_line(key).replace(' ', '-') or '-'} {_one_line(value) or '-'}")
    file_index = {0: 0}  # internal string id -> index in the file
    append = lines.append

    def index_of(internal_id):
        index = file_index.get(internal_id)
        if index is None:
            index = len(file_index)
            file_index[internal_id] = index
            text = _one_line(strings[internal_id]) or "?"
            append(f"s {index} {text}")
        return index

    for event in events:
        kind = event[0]
        if kind == "a":
            record = event[1]
            op = index_of(record.op)
            module = index_of(record.module)
            head = f"a {record.alloc_id} {record.size_bytes} {category(record)}"
            if module:
                append(f"{head} {op} {module}")
            elif op:
                append(f"{head} {op}")
            else:
                append(head)
        elif kind == "f":
            append(f"f {event[1].alloc_id}")
        elif kind == "p":
            append(f"p {event[1]} {event[2]}")
        elif kind == "e":
            append("e")
        else:
            raise ValueError(f"unknown event kind {kind!r}")
    text = "\n".join(lines) + "\n"
    data = text.encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
    return len(data)
