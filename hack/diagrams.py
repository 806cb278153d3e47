"""The documentation's diagrams (docs/assets/*.svg), drawn from the descriptions at the end
of this file by a small SVG writer: they change with a reviewable diff, need nothing but
this project's own Python (no Graphviz, whose binaries CI machines lack; no web service) and
render offline as plain SVG.

hack/gen-docs.py writes them (`make docs-gen`); `hack/gen-docs.py --check` (run by
tests/unit/test_docs_reference.py) fails while a file differs from its description. Drawing
one raises DiagramError, naming the diagram and the part, when a text does not fit its box
or between the lanes it joins, a box leaves the frame it belongs to or the picture, two
boxes of one frame overlap, or a label covers a box: so a picture that would be cut off or
overlap does not build. Text is measured with the advance widths of DejaVu Sans, the first
and widest font of the family list, so it fits in the narrower fallbacks too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from xml.sax.saxutils import escape, quoteattr

FONT_FAMILY = "DejaVu Sans, Helvetica, Arial, sans-serif"
_UNITS_PER_EM = 2048
# Printable ASCII, then arrows, >=, a middle dot, em and en dashes, micro and times signs.
_MEASURED = (
    "".join(chr(c) for c in range(32, 127))
    + "\u2192\u2190\u2194\u2265\u00b7\u2014\u2013\u00b5\u00d7"
)
# Advance widths (1/2048 em) of DejaVu Sans Book and Bold for the characters of _MEASURED,
# in that order, read from the fonts' hmtx tables.
_REGULAR = (
    651, 821, 942, 1716, 1303, 1946, 1597, 563, 799, 799, 1024, 1716, 651, 739, 651, 690,
    1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 690, 690, 1716, 1716, 1716,
    1087, 2048, 1401, 1405, 1430, 1577, 1294, 1178, 1587, 1540, 604, 604, 1343, 1141, 1767,
    1532, 1612, 1235, 1612, 1423, 1300, 1251, 1499, 1401, 2025, 1403, 1251, 1403, 799, 690,
    799, 1716, 1024, 1024, 1255, 1300, 1126, 1300, 1260, 721, 1300, 1298, 569, 569, 1186,
    569, 1995, 1298, 1253, 1300, 1300, 842, 1067, 803, 1298, 1212, 1675, 1212, 1212, 1075,
    1303, 690, 1303, 1716, 1716, 1716, 1716, 1716, 651, 2048, 1024, 1303, 1716,
)  # fmt: skip
_BOLD = (
    713, 934, 1067, 1716, 1425, 2052, 1786, 627, 936, 936, 1071, 1716, 778, 850, 778, 748,
    1425, 1425, 1425, 1425, 1425, 1425, 1425, 1425, 1425, 1425, 819, 819, 1716, 1716, 1716,
    1188, 2048, 1585, 1561, 1503, 1700, 1399, 1399, 1681, 1714, 762, 762, 1587, 1305, 2038,
    1714, 1741, 1501, 1741, 1577, 1475, 1397, 1663, 1585, 2259, 1579, 1483, 1485, 936, 748,
    936, 1716, 1024, 1024, 1382, 1466, 1214, 1466, 1389, 891, 1466, 1458, 702, 702, 1362,
    702, 2134, 1458, 1407, 1466, 1466, 1010, 1219, 979, 1458, 1335, 1892, 1321, 1335, 1192,
    1458, 748, 1458, 1716, 1716, 1716, 1716, 1716, 778, 2048, 1024, 1507, 1716,
)  # fmt: skip
_WIDTHS = {False: dict(zip(_MEASURED, _REGULAR, strict=True)),
           True: dict(zip(_MEASURED, _BOLD, strict=True))}  # fmt: skip

TITLE_SIZE = 13
"""Font size (px) of a box's first line, in bold."""
TEXT_SIZE = 11
"""Font size (px) of a box's other lines and of labels."""
FRAME_SIZE = 15
"""Font size (px) of a frame's title, in bold."""
PAD = 8
"""Space (px) kept between a box's edge and its text."""

STYLES = {
    # fill, stroke, text colour
    "kubernetes": ("#ffffff", "#546e7a", "#263238"),
    "tensile": ("#fff8e1", "#f57f17", "#263238"),
    "vnode": ("#e0f2f1", "#00796b", "#263238"),
    "record": ("#fafafa", "#78909c", "#263238"),
    "upper": ("#e8f0fe", "#3f51b5", "#1a237e"),
    "lower": ("#f1f8e9", "#558b2f", "#33691e"),
    "user": ("#f3e5f5", "#6a1b9a", "#263238"),
}
INK = "#37474f"
"""Colour of arrows and labels."""


class DiagramError(ValueError):
    """A diagram that would not read as drawn: the message names the diagram and part."""


def text_width(text: str, *, size: float, bold: bool = False) -> float:
    """Width (px) of `text` at font `size` (px) in DejaVu Sans (Bold). Raises DiagramError
    for a character it has no width for (add it to _MEASURED and the tables)."""
    widths = _WIDTHS[bold]
    missing = sorted({c for c in text if c not in widths})
    if missing:
        raise DiagramError(f"no width known for {missing!r} in {text!r}")
    return sum(widths[c] for c in text) * size / _UNITS_PER_EM


@dataclasses.dataclass(frozen=True, kw_only=True)
class Frame:
    """A cluster: a titled area boxes belong to."""

    key: str
    x: float
    y: float
    w: float
    h: float
    title: str
    style: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Box:
    """A part: its first line bold, the others smaller, centred; `inside` names its frame."""

    key: str
    x: float
    y: float
    w: float
    h: float
    lines: tuple[str, ...]
    style: str = "kubernetes"
    inside: str | None = None
    dashed: bool = False

    def contains(self, x: float, y: float, *, slack: float = 0.0) -> bool:
        return (
            self.x - slack <= x <= self.x + self.w + slack
            and self.y - slack <= y <= self.y + self.h + slack
        )

    def on_edge(self, x: float, y: float) -> bool:
        return self.contains(x, y, slack=0.5) and not _inside_strictly(self, x, y, margin=0.5)


def _inside_strictly(box: Box, x: float, y: float, *, margin: float) -> bool:
    return (
        box.x + margin < x < box.x + box.w - margin and box.y + margin < y < box.y + box.h - margin
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Label:
    """Text centred on (x, y), one line under the other."""

    x: float
    y: float
    lines: tuple[str, ...]
    anchor: str = "middle"

    def extent(self) -> tuple[float, float, float, float]:
        """(left, top, right, bottom) of the text."""
        width = max(text_width(line, size=TEXT_SIZE) for line in self.lines)
        height = len(self.lines) * (TEXT_SIZE + 3)
        left = {"start": self.x, "middle": self.x - width / 2, "end": self.x - width}[self.anchor]
        top = self.y - height / 2
        return left, top, left + width, top + height


@dataclasses.dataclass(frozen=True, kw_only=True)
class Arrow:
    """A line through `points` with a head at its end (and its start when `both`); each end
    is on the edge of a box or on a lane's lifeline."""

    points: tuple[tuple[float, float], ...]
    both: bool = False
    dashed: bool = False
    label: Label | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Diagram:
    """A picture: its file name under docs/assets/, its accessible title, its size (px)."""

    name: str
    title: str
    width: float
    height: float
    frames: tuple[Frame, ...] = ()
    boxes: tuple[Box, ...] = ()
    arrows: tuple[Arrow, ...] = ()
    lifelines: tuple[float, ...] = ()
    """x of each lane's dashed vertical line (sequence diagrams), from `lifeline_top` down."""
    lifeline_top: float = 0.0
    notes: tuple[Label, ...] = ()


def check(diagram: Diagram) -> None:
    """Raise DiagramError naming the first thing of `diagram` that would not read."""
    for frame in diagram.frames:
        _within(diagram.name, frame.key, (frame.x, frame.y, frame.w, frame.h), diagram)
        if text_width(frame.title, size=FRAME_SIZE, bold=True) > frame.w - 2 * PAD:
            raise DiagramError(f"{diagram.name}: the title of frame {frame.key} is wider than it")
    _check_boxes(diagram)
    for index, arrow in enumerate(diagram.arrows, start=1):
        for x, y in (arrow.points[0], arrow.points[-1]):
            on_box = any(box.on_edge(x, y) for box in diagram.boxes)
            on_lane = any(abs(x - lane) < 0.5 for lane in diagram.lifelines)
            if not (on_box or on_lane):
                raise DiagramError(f"{diagram.name}: arrow {index} ends at ({x}, {y}), on no box")
        if arrow.label is not None:
            _label_clear(diagram.name, f"the label of arrow {index}", arrow.label, diagram)
    for note in diagram.notes:
        _label_clear(diagram.name, f"note {note.lines[0]!r}", note, diagram)


def _check_boxes(diagram: Diagram) -> None:
    name = diagram.name
    frames = {f.key: f for f in diagram.frames}
    for box in diagram.boxes:
        _within(name, box.key, (box.x, box.y, box.w, box.h), diagram)
        _fits(name, box)
        if box.inside is None:
            continue
        frame = frames.get(box.inside)
        if frame is None:
            raise DiagramError(f"{name}: box {box.key} is inside no frame {box.inside!r}")
        if not (
            frame.x + PAD <= box.x
            and box.x + box.w <= frame.x + frame.w - PAD
            and frame.y + FRAME_SIZE + 2 * PAD <= box.y
            and box.y + box.h <= frame.y + frame.h - PAD
        ):
            raise DiagramError(f"{name}: box {box.key} is not inside frame {frame.key}")
    for a, b in _pairs(diagram.boxes):
        if a.inside == b.inside and _overlap(_extent(a), _extent(b)):
            raise DiagramError(f"{name}: boxes {a.key} and {b.key} overlap")


def _fits(name: str, box: Box) -> None:
    for number, line in enumerate(box.lines):
        bold = number == 0
        size = TITLE_SIZE if bold else TEXT_SIZE
        if text_width(line, size=size, bold=bold) > box.w - 2 * PAD:
            raise DiagramError(f"{name}: {line!r} does not fit box {box.key} ({box.w} px)")
    if _text_height(box.lines) > box.h - 2 * PAD + 4:
        raise DiagramError(f"{name}: the lines of box {box.key} do not fit its height")


def _text_height(lines: Sequence[str]) -> float:
    return TITLE_SIZE + (len(lines) - 1) * (TEXT_SIZE + 5)


def _within(name: str, key: str, rect: tuple[float, float, float, float], d: Diagram) -> None:
    x, y, w, h = rect
    if x < 0 or y < 0 or x + w > d.width or y + h > d.height:
        raise DiagramError(f"{name}: {key} leaves the picture ({d.width}x{d.height})")


def _label_clear(name: str, what: str, label: Label, diagram: Diagram) -> None:
    extent = label.extent()
    left, top, right, bottom = extent
    if left < 0 or top < 0 or right > diagram.width or bottom > diagram.height:
        raise DiagramError(f"{name}: {what} leaves the picture")
    for box in diagram.boxes:
        if _overlap(extent, _extent(box)):
            raise DiagramError(f"{name}: {what} covers box {box.key}")


def _extent(box: Box) -> tuple[float, float, float, float]:
    return box.x, box.y, box.x + box.w, box.y + box.h


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _pairs(boxes: Sequence[Box]) -> list[tuple[Box, Box]]:
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]]


# --- SVG ---------------------------------------------------------------------------------


def _n(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, text: str, *, size: float, bold: bool = False,
          anchor: str = "middle", colour: str = INK) -> str:  # fmt: skip
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{_n(x)}" y="{_n(y)}" font-size="{_n(size)}"{weight} '
        f'text-anchor="{anchor}" fill="{colour}">{escape(text)}</text>'
    )


def _frame_svg(frame: Frame) -> list[str]:
    fill, stroke, colour = STYLES[frame.style]
    return [
        f'<rect x="{_n(frame.x)}" y="{_n(frame.y)}" width="{_n(frame.w)}" height="{_n(frame.h)}" '
        f'rx="10" fill="{fill}" stroke="{stroke}" stroke-width="2"/>',
        _text(frame.x + 16, frame.y + FRAME_SIZE + PAD, frame.title, size=FRAME_SIZE, bold=True,
              anchor="start", colour=colour),
    ]  # fmt: skip


def _box_svg(box: Box) -> list[str]:
    fill, stroke, colour = STYLES[box.style]
    dash = ' stroke-dasharray="5 3"' if box.dashed else ""
    out = [
        f'<rect x="{_n(box.x)}" y="{_n(box.y)}" width="{_n(box.w)}" height="{_n(box.h)}" '
        f'rx="6" fill="{fill}" stroke="{stroke}" stroke-width="1.5"{dash}/>'
    ]
    # Baseline of the first line so that the block of lines is centred vertically.
    y = box.y + (box.h - _text_height(box.lines)) / 2 + TITLE_SIZE - 2
    for number, line in enumerate(box.lines):
        bold = number == 0
        out.append(_text(box.x + box.w / 2, y, line, size=TITLE_SIZE if bold else TEXT_SIZE,
                         bold=bold, colour=colour))  # fmt: skip
        y += TEXT_SIZE + 5
    return out


def _label_svg(label: Label) -> list[str]:
    _, top, _, _ = label.extent()
    y = top + TEXT_SIZE
    out = []
    for line in label.lines:
        out.append(_text(label.x, y, line, size=TEXT_SIZE, anchor=label.anchor))
        y += TEXT_SIZE + 3
    return out


def _arrow_svg(arrow: Arrow) -> list[str]:
    points = " ".join(f"{_n(x)},{_n(y)}" for x, y in arrow.points)
    dash = ' stroke-dasharray="6 4"' if arrow.dashed else ""
    start = ' marker-start="url(#arrow)"' if arrow.both else ""
    out = [
        f'<polyline points="{points}" fill="none" stroke="{INK}" stroke-width="1.5"{dash}'
        f'{start} marker-end="url(#arrow)"/>'
    ]
    if arrow.label is not None:
        out += _label_svg(arrow.label)
    return out


def render(diagram: Diagram) -> str:
    """The SVG text of `diagram`, after `check`. Raises DiagramError (see `check`)."""
    check(diagram)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_n(diagram.width)} '
        f'{_n(diagram.height)}" width="{_n(diagram.width)}" height="{_n(diagram.height)}" '
        f"font-family={quoteattr(FONT_FAMILY)}>",
        f"<title>{escape(diagram.title)}</title>",
        "<!-- Generated by hack/gen-docs.py from hack/diagrams.py: do not edit; run "
        "`make docs-gen`. -->",
        "<defs>",
        '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8" '
        'markerHeight="8" markerUnits="userSpaceOnUse" orient="auto-start-reverse">',
        f'<path d="M0,0 L10,5 L0,10 z" fill="{INK}"/>',
        "</marker>",
        "</defs>",
        f'<rect x="0" y="0" width="{_n(diagram.width)}" height="{_n(diagram.height)}" '
        'fill="#ffffff"/>',
    ]
    for frame in diagram.frames:
        out += _frame_svg(frame)
    for x in diagram.lifelines:
        out.append(
            f'<line x1="{_n(x)}" y1="{_n(diagram.lifeline_top)}" x2="{_n(x)}" '
            f'y2="{_n(diagram.height - 12)}" stroke="#b0bec5" stroke-width="1.5" '
            'stroke-dasharray="4 4"/>'
        )
    for box in diagram.boxes:
        out += _box_svg(box)
    for arrow in diagram.arrows:
        out += _arrow_svg(arrow)
    for note in diagram.notes:
        out += _label_svg(note)
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --- sequence diagrams -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lane:
    """A participant of a sequence diagram, its header box's lines, and its centre (x)."""

    key: str
    x: float
    lines: tuple[str, ...]
    style: str = "kubernetes"
    width: float = 130


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """A message from lane `source` to lane `target` (the same lane: something that lane
    does by itself, written beside it), labelled above the line."""

    source: str
    target: str
    lines: tuple[str, ...]
    reply: bool = False


def sequence(
    *, name: str, title: str, width: float, lanes: Sequence[Lane], steps: Sequence[Step]
) -> Diagram:
    """A sequence diagram: the lanes' headers in a row, their lifelines, the steps from top
    to bottom (replies dashed). Raises DiagramError when a label is wider than the gap
    between the lanes it joins."""
    by_key = {lane.key: lane for lane in lanes}
    header_top, header_h = 12.0, 46.0
    boxes = tuple(
        Box(key=lane.key, x=lane.x - lane.width / 2, y=header_top, w=lane.width, h=header_h,
            lines=lane.lines, style=lane.style)
        for lane in lanes
    )  # fmt: skip
    arrows: list[Arrow] = []
    notes: list[Label] = []
    y = header_top + header_h + 14
    for step in steps:
        height = len(step.lines) * (TEXT_SIZE + 3)
        y += height + 6
        source, target = by_key[step.source].x, by_key[step.target].x
        if source == target:
            notes.append(Label(x=source + 8, y=y - height / 2 + 2, lines=step.lines,
                               anchor="start"))  # fmt: skip
            room = min((abs(lane.x - source) for lane in lanes if lane.x > source), default=0)
            widest = max(text_width(line, size=TEXT_SIZE) for line in step.lines)
            if widest > room - 16:
                raise DiagramError(f"{name}: {step.lines[0]!r} is wider than its lane's room")
            y += 8
            continue
        label = Label(x=(source + target) / 2, y=y - height / 2 - 3, lines=step.lines)
        widest = max(text_width(line, size=TEXT_SIZE) for line in step.lines)
        if widest > abs(target - source) - 16:
            raise DiagramError(
                f"{name}: {step.lines[0]!r} is wider than the gap between "
                f"{step.source} and {step.target}"
            )
        arrows.append(Arrow(points=((source, y), (target, y)), dashed=step.reply, label=label))
        y += 12
    return Diagram(
        name=name,
        title=title,
        width=width,
        height=y + 16,
        boxes=boxes,
        arrows=tuple(arrows),
        lifelines=tuple(lane.x for lane in lanes),
        lifeline_top=header_top + header_h,
        notes=tuple(notes),
    )


# --- the diagrams ------------------------------------------------------------------------


def architecture() -> Diagram:
    """The parts: the upper cluster with the programs and the virtual nodes' processes,
    and the lower clusters they forward to."""
    upper = Frame(key="upper", x=20, y=20, w=860, h=372, title="upper cluster: where users "
                  "create pods", style="upper")  # fmt: skip
    lower_a = Frame(key="lower-a", x=20, y=452, w=420, h=128, title="lower cluster A",
                    style="lower")  # fmt: skip
    lower_b = Frame(key="lower-b", x=460, y=452, w=420, h=128, title="lower cluster B",
                    style="lower")  # fmt: skip
    row1, row2, row3 = 64.0, 146.0, 290.0
    boxes = (
        Box(key="webhook", x=40, y=row1, w=250, h=56, inside="upper", style="tensile",
            lines=("tensile-webhook", "admission: clusterSelector, tolerations")),
        Box(key="apiserver", x=325, y=row1, w=250, h=56, inside="upper",
            lines=("kube-apiserver", "pods, Services, claims, Nodes, Leases")),
        Box(key="scheduler", x=610, y=row1, w=250, h=56, inside="upper", style="tensile",
            lines=("kube-scheduler", "+ tensile-scheduler: fit, quota slices")),
        Box(key="descheduler", x=40, y=row2, w=250, h=56, inside="upper", style="tensile",
            lines=("tensile-descheduler", "moves pods a lower cluster cannot place")),
        Box(key="nodes", x=610, y=row2, w=250, h=56, inside="upper", dashed=True,
            style="vnode",
            lines=("Nodes lower-a, lower-b", "type=virtual-kubelet; capacity: free below")),
        Box(key="vn-a", x=40, y=row3, w=330, h=84, inside="upper", style="vnode",
            lines=("virtual-node lower-a", "a Deployment on an upper host:",
                   "pods down, status and Events up, copies;",
                   "kubelet API: logs, exec, port-forward, top")),
        Box(key="vn-b", x=530, y=row3, w=330, h=84, inside="upper", style="vnode",
            lines=("virtual-node lower-b", "a Deployment on an upper host:",
                   "pods down, status and Events up, copies;",
                   "kubelet API: logs, exec, port-forward, top")),
        Box(key="lower-a-api", x=40, y=500, w=170, h=56, inside="lower-a",
            lines=("kube-apiserver", "of lower cluster A")),
        Box(key="lower-a-nodes", x=240, y=500, w=180, h=56, inside="lower-a",
            lines=("nodes, scheduler", "the pods really run here")),
        Box(key="lower-b-api", x=480, y=500, w=170, h=56, inside="lower-b",
            lines=("kube-apiserver", "of lower cluster B")),
        Box(key="lower-b-nodes", x=680, y=500, w=180, h=56, inside="lower-b",
            lines=("nodes, scheduler", "the pods really run here")),
    )  # fmt: skip
    arrows = (
        Arrow(points=((290, row1 + 28), (325, row1 + 28)), both=True),
        Arrow(points=((610, row1 + 28), (575, row1 + 28)), both=True),
        Arrow(points=((290, row2 + 20), (340, row1 + 56)), both=True),
        Arrow(points=((575, row1 + 42), (610, row2 + 14)), dashed=True),
        Arrow(points=((300, row3), (420, row1 + 56)), both=True,
              label=Label(x=450, y=246, lines=("watch pods, register the Node,",
                                               "renew its Lease, write status;",
                                               "the apiserver calls the kubelet API"))),
        Arrow(points=((600, row3), (480, row1 + 56)), both=True),
        Arrow(points=((125, row3 + 84), (125, 500)), both=True,
              label=Label(x=133, y=422, anchor="start",
                          lines=("--client-kubeconfig: pods and copies down,",
                                 "status and Events up"))),
        Arrow(points=((565, row3 + 84), (565, 500)), both=True,
              label=Label(x=573, y=422, anchor="start",
                          lines=("the same, to lower cluster B",))),
    )  # fmt: skip
    return Diagram(
        name="architecture.svg",
        title=(
            "tensile: an upper cluster running the webhook, the scheduler and its extender, "
            "the descheduler and one virtual-node process per lower cluster; each process "
            "registers a Node upstairs and forwards that Node's pods to its lower cluster's "
            "apiserver"
        ),
        width=900,
        height=600,
        frames=(upper, lower_a, lower_b),
        boxes=boxes,
        arrows=arrows,
    )


def pod_path() -> Diagram:
    """A pod's path down to its lower cluster and its status back up."""
    lanes = (
        Lane(key="user", x=68, lines=("you", "or a controller"), style="user", width=126),
        Lane(key="webhook", x=205, lines=("tensile-webhook",), style="tensile", width=140),
        Lane(key="upper", x=340, lines=("upper", "kube-apiserver"), width=120),
        Lane(key="scheduler", x=470, lines=("kube-scheduler", "(+ extender)"), style="tensile",
             width=130),
        Lane(key="vnode", x=612, lines=("virtual-node",), style="vnode", width=120),
        Lane(key="lower", x=755, lines=("lower", "kube-apiserver"), width=120),
        Lane(key="kubelet", x=880, lines=("lower", "scheduler, node"), width=110),
    )  # fmt: skip
    steps = (
        Step(source="user", target="upper", lines=("1 create the pod",)),
        Step(source="upper", target="webhook", lines=("2 admission",)),
        Step(source="webhook", target="upper", reply=True,
             lines=("3 placement split:", "clusterSelector")),
        Step(source="scheduler", target="upper", lines=("4 bind to a", "virtual node")),
        Step(source="upper", target="vnode", lines=("5 watch: a pod bound", "to this node")),
        Step(source="vnode", target="lower", lines=("6 copies: ConfigMaps,", "Secrets, claims")),
        Step(source="vnode", target="lower", lines=("7 create the pod",)),
        Step(source="lower", target="kubelet", lines=("8 schedule,", "run")),
        Step(source="kubelet", target="lower", reply=True, lines=("9 status",)),
        Step(source="lower", target="vnode", reply=True, lines=("10 watch:", "status, Events")),
        Step(source="vnode", target="upper", reply=True,
             lines=("11 the pod's status,", "its Events")),
        Step(source="upper", target="user", reply=True, lines=("12 Running",)),
    )  # fmt: skip
    return sequence(
        name="pod-path.svg",
        title=(
            "A pod's path: created upstairs, converted by the webhook, bound to a virtual "
            "node by the scheduler; the virtual node copies what it needs and creates it "
            "below, where the lower scheduler places it; its status and Events come back up"
        ),
        width=940,
        lanes=lanes,
        steps=steps,
    )


def kubelet_api_path() -> Diagram:
    """`kubectl logs` and `exec` through the virtual node's kubelet API."""
    lanes = (
        Lane(key="user", x=80, lines=("kubectl", "logs, exec"), style="user", width=130),
        Lane(key="upper", x=270, lines=("upper", "kube-apiserver"), width=130),
        Lane(key="vnode", x=500, lines=("virtual-node", "kubelet API"), style="vnode",
             width=130),
        Lane(key="lower", x=710, lines=("lower", "kube-apiserver"), width=130),
        Lane(key="kubelet", x=860, lines=("lower", "kubelet"), width=110),
    )  # fmt: skip
    steps = (
        Step(source="user", target="upper", lines=("1 pods/log, pods/exec",)),
        Step(source="upper", target="vnode",
             lines=("2 HTTPS to the Node's", "InternalIP : kubelet port")),
        Step(source="vnode", target="upper",
             lines=("3 who calls, may it?", "TokenReview, SAR")),
        Step(source="vnode", target="lower",
             lines=("4 pods/log, pods/exec", "of the lower pod")),
        Step(source="lower", target="kubelet", lines=("5 the", "container")),
        Step(source="kubelet", target="lower", reply=True, lines=("6 stream",)),
        Step(source="lower", target="vnode", reply=True,
             lines=("7 the stream", "(WebSocket)")),
        Step(source="vnode", target="upper", reply=True,
             lines=("8 the stream", "(SPDY, chunked logs)")),
        Step(source="upper", target="user", reply=True, lines=("9 the stream",)),
    )  # fmt: skip
    return sequence(
        name="kubelet-api-path.svg",
        title=(
            "kubectl logs and exec: the upper apiserver calls the virtual node's kubelet API "
            "at the Node's address; the node checks the caller, then opens the same call on "
            "the lower pod and bridges the stream both ways"
        ),
        width=940,
        lanes=lanes,
        steps=steps,
    )


def placement() -> Diagram:
    """Where a pod runs: the four deciders in order, and the descheduler's loop back."""
    upper = Frame(key="upper", x=20, y=20, w=660, h=290, title="upper cluster", style="upper")
    lower = Frame(key="lower", x=700, y=20, w=180, h=290, title="lower cluster",
                  style="lower")  # fmt: skip
    row1, row2 = 70.0, 200.0
    boxes = (
        Box(key="webhook", x=40, y=row1, w=190, h=84, inside="upper", style="tensile",
            lines=("1 tensile-webhook", "at creation: splits the", "placement, adds the",
                   "tolerations")),
        Box(key="scheduler", x=260, y=row1, w=190, h=84, inside="upper", style="tensile",
            lines=("2 kube-scheduler", "picks a virtual node;", "the extender: one where",
                   "the pod fits")),
        Box(key="vnode", x=480, y=row1, w=180, h=84, inside="upper", style="vnode",
            lines=("3 virtual-node", "the lower pod gets the", "clusterSelector",
                   "placement")),
        Box(key="lower", x=710, y=row1, w=160, h=84, inside="lower",
            lines=("4 kube-scheduler", "picks a lower", "node, or marks", "it Unschedulable")),
        Box(key="record", x=40, y=row2, w=190, h=84, inside="upper", style="record",
            lines=("avoidance record", "ConfigMap", "tensile-avoid:", "who avoids which node")),
        Box(key="descheduler", x=370, y=row2, w=290, h=84, inside="upper", style="tensile",
            lines=("5 tensile-descheduler", "a pod Unschedulable below too long:",
                   "evicted (PodDisruptionBudgets kept)", "or re-created, off this node")),
    )  # fmt: skip
    arrows = (
        Arrow(points=((230, row1 + 42), (260, row1 + 42))),
        Arrow(points=((450, row1 + 42), (480, row1 + 42))),
        Arrow(points=((660, row1 + 42), (710, row1 + 42))),
        Arrow(points=((790, row1 + 84), (790, row2 + 42), (660, row2 + 42)), dashed=True,
              label=Label(x=782, y=row2 - 22, anchor="end", lines=("its status,", "mirrored up"))),
        Arrow(points=((370, row2 + 42), (230, row2 + 42)),
              label=Label(x=300, y=row2 + 30, lines=("records",))),
        Arrow(points=((135, row2), (135, row1 + 84)),
              label=Label(x=143, y=row2 - 23, anchor="start",
                          lines=("the replacement avoids", "the node it left"))),
    )  # fmt: skip
    return Diagram(
        name="placement.svg",
        title=(
            "Placement: the webhook splits a pod's placement at creation, the upper "
            "scheduler (with the extender) picks a virtual node, the virtual node passes the "
            "lower half below, the lower scheduler picks a node; a pod left Unschedulable "
            "below is moved by the descheduler, whose avoidance record the webhook reads"
        ),
        width=900,
        height=330,
        frames=(upper, lower),
        boxes=boxes,
        arrows=arrows,
    )


DIAGRAMS: dict[str, Callable[[], Diagram]] = {
    "architecture.svg": architecture,
    "pod-path.svg": pod_path,
    "kubelet-api-path.svg": kubelet_api_path,
    "placement.svg": placement,
}
"""Every diagram, by its file name under docs/assets/."""
