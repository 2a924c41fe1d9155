"""The checker itself: it accepts the document's example and rejects each broken rule."""

import pytest

from event_stream_check import check_text

EXAMPLE = """vramscope-events 1
meta source example
s 1 aten::empty
s 2 model.layers.0.mlp
a 1 33554432 param 1 2
p 1 forward
a 2 8388608 act 1 2
a 3 1048576 temp
f 3
p 1 backward
a 4 33554432 grad 1 2
f 2
p 1 optimizer
a 5 33554432 optim
a 6 33554432 optim
f 4
"""


def test_accepts_the_documented_example():
    checked = check_text(EXAMPLE)
    assert checked.events == 12
    assert checked.phases == [(1, "forward"), (1, "backward"), (1, "optimizer")]
    assert checked.peak_live_bytes == 33554432 * 4
    assert checked.final_live_bytes == 33554432 * 3


def test_accepts_comments_crlf_and_long_category_names():
    checked = check_text("vramscope-events 1\r\n# comment\n\na 1 10 activations\r\nf 1\n")
    assert checked.allocs == 1 and checked.frees == 1


@pytest.mark.parametrize("text, problem", [
    ("vramscope-events 2\n", "header"),
    ("a 1 10 act\n", "header"),
    ("vramscope-events 1\ns 2 x\n", "string index"),
    ("vramscope-events 1\na 1 10 act 1\n", "not defined"),
    ("vramscope-events 1\na 1 10 act\na 1 10 act\n", "still live"),
    ("vramscope-events 1\nf 1\n", "not live"),
    ("vramscope-events 1\np 1 sideways\n", "unknown phase"),
    ("vramscope-events 1\na 1 10 weights\n", "unknown category"),
    ("vramscope-events 1\na 1 -10 act\n", "unsigned"),
    ("vramscope-events 1\na 1 %d act\n" % (2 ** 62 + 1), r"above 2\^62"),
    ("vramscope-events 1\nx 1\n", "unknown record"),
    ("vramscope-events 1\nf 1 2\n", "f takes"),
    ("vramscope-events 1\na " + "1" * 70000 + " 1 act\n", "longer than 65536"),
])
def test_rejects(text, problem):
    with pytest.raises(ValueError, match=problem):
        check_text(text)
