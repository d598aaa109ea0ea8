"""The lesson files: parsing one (load_lesson), all of them in order (load_lessons), and the lesson a stage shows
(lesson_for_stage). The format is lessons/README.md's: a `# NN. Title` line, then `Key: value` header lines until
the first blank line (Stage, Code, optionally Lesson code), then the markdown text.

A Code reference is `path.py`, `path.py:name` or `path.py:Class.method`, relative to the repository root, which is
also the directory above the installed `tinyvllm` package (kernels_numba/, lessons/ and debugger/ install beside it),
so CodeRef.file resolves in a checkout and in an installed wheel alike."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from tinyvllm.errors import TinyVLLMError

LESSONS_DIR = Path(__file__).resolve().parent / "lessons"
SOURCE_ROOT = LESSONS_DIR.parent.parent.parent  # the repository root, or site-packages for a wheel
LESSON_FILE = re.compile(r"^(\d\d)-([a-z0-9][a-z0-9-]*)\.md$")
TITLE = re.compile(r"^# (\d\d)\. (\S.*)$")
HEADER = re.compile(r"^([A-Z][A-Za-z ]*): (.*)$")
REFERENCE = re.compile(r"^(?P<path>[\w./-]+\.py)(?::(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?))?$")
HEADER_KEYS = ("Stage", "Code", "Lesson code")
REQUIRED_KEYS = ("Stage", "Code")


@dataclass(frozen=True)
class Chapter:
    number: int
    slug: str
    topic: str


# The course's chapters, in order (lessons/README.md is their index).
CHAPTERS = tuple(Chapter(n, slug, topic) for n, slug, topic in [
    (1, "intro", "LLMs, vLLM, models, inference servers; prerequisites"),
    (2, "safetensors", "safetensors and your model"),
    (3, "bfloat16", "how floating point works, why bf16"),
    (4, "memory", "GPU and CPU memory"),
    (5, "single-token", "single-token inference"),
    (6, "tokenization", "tokenization"),
    (7, "embedding", "embeddings, and a first kernel: the embedding lookup"),
    (8, "rmsnorm", "RMSNorm and parallel reduction"),
    (9, "rope", "RoPE"),
    (10, "residual", "residual connections"),
    (11, "matmul", "matrix multiplication, and the row-major / column-major trick"),
    (12, "prefill-decode", "prefill vs decode"),
    (13, "kv-cache", "why the KV cache exists"),
    (14, "attention", "attention; GQA"),
    (15, "silu-softmax-argmax", "SiLU; softmax; the causal mask; argmax"),
    (16, "ffn", "the feed-forward network"),
    (17, "buffer-reuse", "buffer reuse"),
    (18, "batching", "static batching; continuous batching"),
    (19, "online-softmax", "online softmax"),
    (20, "paged-attention", "PagedAttention; the paged KV cache; the PagedAttention kernel"),
    (21, "tensor-cores", "tensor cores from numba"),
    (22, "cuda-graphs", "CUDA graphs"),
    (23, "chunked-prefill", "chunked prefill and prefix caching"),
    (24, "sampling", "sampling"),
    (25, "server-loop", "the server loop"),
    (26, "evaluation", "evaluation"),
])


class CourseError(TinyVLLMError):
    """A lesson file that does not follow the format; the message names the file and line."""

    def __init__(self, path: Path, line: int, message: str):
        super().__init__(f"{path}:{line}: {message}")
        self.path, self.line, self.message = path, line, message


@dataclass(frozen=True)
class CodeRef:
    """A reference to source: `path` (relative to the repository root) and optionally `name` (a top-level def,
    class or assignment, or Class.member); `line` is where the lesson cites it."""
    path: str
    name: str | None
    line: int

    @classmethod
    def parse(cls, text: str, line: int) -> CodeRef | None:
        """The reference `text` spells, or None when it is not shaped like one."""
        m = REFERENCE.match(text.strip())
        return cls(m["path"], m["name"], line) if m else None

    @property
    def file(self) -> Path:
        return SOURCE_ROOT / self.path

    def definition_line(self) -> int | None:
        """The line where `name` is defined in the file (1 for a reference to the whole file), or None when the
        file or the name is not there (CodeRef.missing says which)."""
        return None if self.missing() else (definition_line(self.file, self.name) if self.name else 1)

    def missing(self) -> str | None:
        """What of the reference is not in the source (the file, or the name in it), or None."""
        if not self.file.is_file():
            return f"{self.path} does not exist"
        if self.name and definition_line(self.file, self.name) is None:
            return f"{self.path} defines no {self.name}"
        return None

    def __str__(self) -> str:
        return f"{self.path}:{self.name}" if self.name else self.path


@dataclass(frozen=True)
class Lesson:
    number: int
    slug: str
    title: str
    stage: str             # where the tour stops: one of stages.py's tour_stages()
    code: tuple[CodeRef, ...]         # the first is the source the tour shows a key away
    lesson_code: tuple[CodeRef, ...]  # lessons/ kernels, where they differ from production
    text: str              # the whole markdown file
    path: Path
    stage_line: int        # the line of the Stage header, for error messages
    body_line: int         # the first line after the header block: where `body` starts

    @property
    def body(self) -> str:
        """The markdown after the title and the header lines (what a panel beside the title shows)."""
        return "\n".join(self.text.splitlines()[self.body_line - 1:]).strip("\n") + "\n"

    @property
    def name(self) -> str:
        return f"{self.number:02d}-{self.slug}"


def _defined_names(body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """The names a module or class body defines (def, class, assignment) -> their statement."""
    names = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


def find_definition(tree: ast.Module, name: str) -> ast.stmt | None:
    """The statement defining `name` (top-level, or Class.member) in a parsed module, or None."""
    node, body = None, tree.body
    for part in name.split("."):
        node = _defined_names(body).get(part)
        if node is None:
            return None
        body = node.body if isinstance(node, ast.ClassDef) else []
    return node


def definition_line(file: Path, name: str) -> int | None:
    """The line defining `name` (top-level, or Class.member) in the Python file, or None."""
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError):
        return None
    node = find_definition(tree, name)
    return None if node is None else node.lineno


def lesson_files(directory: Path = LESSONS_DIR) -> list[Path]:
    """The lesson files of `directory` (NN-slug.md), in chapter order."""
    return sorted(p for p in Path(directory).iterdir() if LESSON_FILE.match(p.name))


def _references(value: str, path: Path, line: int) -> tuple[CodeRef, ...]:
    refs = []
    for part in value.split(","):
        ref = CodeRef.parse(part, line)
        if ref is None:
            raise CourseError(path, line, f"{part.strip()!r} is not a reference "
                              "(path.py, path.py:name or path.py:Class.method)")
        refs.append(ref)
    return tuple(refs)


def load_lesson(path: Path) -> Lesson:
    """Parse one lesson file; a CourseError names the file and line of anything off the format."""
    path = Path(path)
    m = LESSON_FILE.match(path.name)
    if not m:
        raise CourseError(path, 1, "a lesson file is named NN-slug.md")
    number, slug = int(m[1]), m[2]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CourseError(path, 1, f"cannot read it ({e})") from None
    lines = text.splitlines()
    title = TITLE.match(lines[0]) if lines else None
    if not title:
        raise CourseError(path, 1, f"the first line must be '# {number:02d}. Title'")
    if int(title[1]) != number:
        raise CourseError(path, 1, f"the title's number {title[1]} is not the file's {number:02d}")
    header, header_lines, body_line = {}, {}, len(lines) + 1
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            if header:
                body_line = i + 1
                break
            continue
        h = HEADER.match(line)
        if not h or h[1] not in HEADER_KEYS:
            raise CourseError(path, i, f"expected a header line ({', '.join(HEADER_KEYS)}: value), "
                              f"got {line!r}")
        if h[1] in header:
            raise CourseError(path, i, f"{h[1]} is given twice")
        header[h[1]], header_lines[h[1]] = h[2].strip(), i
    for key in REQUIRED_KEYS:
        if key not in header:
            raise CourseError(path, 2, f"the header has no {key}: line")
    lesson_code = (_references(header["Lesson code"], path, header_lines["Lesson code"])
                   if "Lesson code" in header else ())
    return Lesson(number=number, slug=slug, title=title[2].strip(), stage=header["Stage"],
                  code=_references(header["Code"], path, header_lines["Code"]), lesson_code=lesson_code,
                  text=text, path=path, stage_line=header_lines["Stage"], body_line=body_line)


def load_lessons(directory: Path = LESSONS_DIR) -> list[Lesson]:
    """Every lesson, in chapter order."""
    return [load_lesson(p) for p in lesson_files(directory)]


def _layer_free(stage: str) -> str:
    """`layers.3.attn` -> `layers.attn`: the same step in any layer."""
    parts = stage.split(".")
    return f"layers.{parts[2]}" if len(parts) == 3 and parts[0] == "layers" else stage


def lessons_for_stage(stage: str, lessons: list[Lesson] | None = None) -> list[Lesson]:
    """The lessons about `stage`, in chapter order: those stopping at exactly that stage, then those stopping at the
    same step of another layer (a user stopping at layers.1.attn sees the lesson of layers.0.attn)."""
    lessons = load_lessons() if lessons is None else lessons
    exact = [lesson for lesson in lessons if lesson.stage == stage]
    same_step = [lesson for lesson in lessons
                 if lesson.stage != stage and _layer_free(lesson.stage) == _layer_free(stage)]
    return exact + same_step


def lesson_for_stage(stage: str, lessons: list[Lesson] | None = None) -> Lesson | None:
    """The first lesson about `stage` (lessons_for_stage), or None."""
    found = lessons_for_stage(stage, lessons)
    return found[0] if found else None
