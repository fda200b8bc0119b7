"""Job fingerprints: what a claim remembers of its payload, to catch a key
pushed again with different work.

A fingerprint is 8 bytes naming the function, followed by 8 bytes digesting
the arguments when they can be read cheaply (16 bytes in all), or by nothing
when they cannot (8 bytes: the function alone is compared).

The function is named by its module and qualified name, and for a function
defined inside another (a closure, a lambda) also by the file and line of its
code, so two lambdas written on different lines differ. What a closure
captures is not part of it: two closures from the same line are the same
function here. A ``functools.partial`` is its function plus its bound
arguments.

Arguments are read cheaply when they are built only from ``None``, ``bool``,
``int``, ``float``, ``complex``, ``str``, ``bytes``, and tuples, lists, dicts
(with str keys), sets and frozensets of those, with at most
``MAX_NODES`` values and ``MAX_BYTES`` of text in all. Anything else (an array,
an object of your own class, a very large argument) is not read: such a job's
fingerprint is its function alone. Reading is exact on types: ``1``, ``1.0``
and ``True`` are different arguments.

Reading is exact on values too, and the same for the same values built
again: every float is read as its shortest repr, so any NaN reads ``nan``
(``nan != nan``, and ``hash(nan)`` follows the object, so a NaN rebuilt
would otherwise conflict with itself) and ``-0.0`` differs from ``0.0``; ints
are read whole, never through ``hash()`` (where ``-1`` and ``-2``, or ``x``
and ``x + 2**61 - 1``, are one value).

Why not hash the pickle the push makes anyway: a push that joins a live key or
answers from the store never pickles (that is most of its speed), and pickles
of equal dicts differ with their insertion order.
"""

from __future__ import annotations

import contextlib
import functools
import marshal
import weakref
from collections.abc import Callable
from typing import Any

from procq._wire.protocol import blake2b

__all__ = ["MAX_BYTES", "MAX_NODES", "content_key", "describe", "fingerprint", "fn_name", "job_fingerprint"]

#: Beyond this many values, arguments are not read (the function alone counts).
MAX_NODES = 10_000
#: Beyond this much str / bytes data, arguments are not read.
MAX_BYTES = 1 << 20

_SCALARS = (type(None), bool, float, complex)
_NO_ARGS = b"\x00" * 8


class _TooCostly(Exception):
    pass


def fn_name(fn: Callable[..., Any]) -> str:
    """A readable name for ``fn``: ``module.qualname`` (plus where a local
    function or lambda is defined)."""
    if isinstance(fn, functools.partial):
        return f"functools.partial({fn_name(fn.func)})"
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    name = f"{module}.{qualname}"
    if "<" in qualname:  # <lambda>, <locals>: defined inside something
        code = getattr(fn, "__code__", None)
        if code is not None:
            name += f" ({code.co_filename}:{code.co_firstlineno})"
    return name


def _digest(text: str | bytes) -> bytes:
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return blake2b(data, digest_size=8).digest()


_heads: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()
# Module-level functions live as long as their module: kept in a plain dict,
# whose lookup costs a fraction of a weak one's (this runs at every push).
_module_heads: dict[Any, bytes] = {}


def _head(fn: Callable[..., Any]) -> bytes:
    head = _module_heads.get(fn) if type(fn) is _FunctionType else None
    if head is not None:
        return head
    try:
        head = _heads.get(fn)
    except TypeError:  # not hashable or not weakly referable: named each time
        return _digest(fn_name(fn))
    if head is None:
        head = _digest(fn_name(fn))
        qualname = getattr(fn, "__qualname__", "<")
        if type(fn) is _FunctionType and "<" not in qualname and "." not in qualname and len(_module_heads) < 4096:
            _module_heads[fn] = head
            return head
        with contextlib.suppress(TypeError):
            _heads[fn] = head
    return head


_FunctionType = type(_digest)
#: Argument types read by the fast path of ``fingerprint``: flat, immutable, written exactly by marshal.
_FLAT = frozenset({type(None), bool, int, float, str, bytes})
_marshal = marshal.dumps


def job_fingerprint(job: Any) -> bytes:
    """``fingerprint`` of a ``Job``, kept on the job when its arguments are
    flat (immutable values: its fingerprint cannot change), so pushing the
    same ``Job`` again costs a dict read."""
    fields = job.__dict__
    fp: bytes | None = fields.get("_fp")
    if fp is not None:
        return fp
    fn, args = fields["fn"], fields["args"]
    head = _module_heads.get(fn) if type(fn) is _FunctionType and fields["kwargs"] is None else None
    if head is not None and (not args or _FLAT.issuperset(map(type, args))):
        # ``fingerprint``'s common case without its checks made twice (this
        # runs at every push): a module-level function already named, and a
        # few flat arguments.
        fp = fields["_fp"] = head + _NO_ARGS if not args else _flat(head, args)
        return fp
    fp = fingerprint(fn, args, job.kwargs)
    if not job.kwargs and not isinstance(fn, functools.partial) and _FLAT.issuperset(map(type, args)):
        fields["_fp"] = fp
    return fp


def _flat(head: bytes, args: tuple[Any, ...]) -> bytes:
    """The fingerprint of a function (``head``) and flat arguments (see ``fingerprint``)."""
    # Text and bytes past MAX_BYTES are known too large before marshal copies
    # them (a str's marshal is at least one byte a character): the result is
    # the same, without writing a copy of a large argument first.
    if sum(len(a) for a in args if type(a) is bytes or type(a) is str) > MAX_BYTES:
        return head
    data = _marshal(args, 0)
    if len(data) > MAX_BYTES:  # too large to compare: the function alone
        return head
    return head + hash(data).to_bytes(8, "little", signed=True)


def fingerprint(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Any) -> bytes:
    """The fingerprint of a job (see the module docstring)."""
    while isinstance(fn, functools.partial):
        args = (*fn.args, *args)
        kwargs = {**fn.keywords, **(kwargs or {})}
        fn = fn.func
    head = _head(fn)
    if not kwargs and type(args) is tuple:
        # The common case, at every push: a few flat values. marshal (format
        # 0) writes them exactly and in C: a tag per type (1, 1.0 and True
        # differ), ints whole, floats as their repr (every NaN the same),
        # text whole and never as "interned" or as a back-reference, so equal
        # arguments always give equal bytes. Not hash(args): it is not exact
        # (hash(-1) == hash(-2)) and a NaN's hash is its address.
        if not args:
            return head + _NO_ARGS
        if _FLAT.issuperset(map(type, args)):
            return _flat(head, args)
    parts: list[str] = []
    budget = [MAX_NODES, MAX_BYTES]
    try:
        _encode(args, parts, budget)
        _encode(kwargs or {}, parts, budget)
    except (_TooCostly, RecursionError):
        return head
    return head + _digest("".join(parts))


def content_key(fn: Callable[..., Any], item: Any) -> str:
    """``q.map``'s key for ``fn(item)`` when none is given:
    ``"map:<function>:<item>"``, two hex digests (8 and 16 bytes) of the
    function's name and of the item, read as arguments are (see the module
    docstring) or, when that is too costly, of its pickle (``_large_digest``)."""
    parts: list[str] = []
    try:
        _encode(item, parts, [MAX_NODES, MAX_BYTES])
    except (_TooCostly, RecursionError):
        return f"map:{_head(fn).hex()}:{_large_digest(item)}"
    data = "".join(parts).encode("utf-8", "surrogatepass")
    return f"map:{_head(fn).hex()}:{blake2b(data, digest_size=16).hexdigest()}"


def _large_digest(item: Any) -> str:
    """A 16-byte hex digest of an item too costly to read: its pickle, with
    large buffers (arrays, bytes) out of band and digested where they lie, so
    no copy of them is made. XXH3-128: one pass at memory speed (a 16 MiB
    array in about half a millisecond, some 15 times faster than any digest
    of ``hashlib`` here), and a key needs no defence against collisions
    crafted on purpose (it is made from the caller's own data)."""
    import xxhash

    from procq._wire.oob import dumps_oob
    from procq._wire.protocol import dumps_fn  # (cloudpickle, for what pickle refuses)

    data, buffers = dumps_oob(item, dumps_fn)
    digest = xxhash.xxh3_128(b"p")
    digest.update(data)
    for buffer in buffers:
        raw = buffer.raw()
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    return digest.hexdigest()


def _encode(value: Any, out: list[str], budget: list[int]) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooCostly
    t = type(value)
    if t is int:
        # In hex: exact, linear in its size, and never refused (decimal is
        # past 4,300 digits); a huge int counts against the text budget.
        if value.bit_length() > 64:
            budget[1] -= value.bit_length() >> 3
            if budget[1] < 0:
                raise _TooCostly
        out.append(f"i{value:x};")
    elif t in _SCALARS:
        out.append(f"{t.__name__[0]}{value!r};")
    elif t is str or t is bytes:
        budget[1] -= len(value)
        if budget[1] < 0:
            raise _TooCostly
        out.append(f"{'s' if t is str else 'b'}{len(value)}:")
        out.append(value if t is str else value.hex())
    elif t is tuple or t is list:
        out.append(f"{'t' if t is tuple else 'l'}{len(value)}(")
        for item in value:
            _encode(item, out, budget)
        out.append(")")
    elif t is dict:
        if not all(type(k) is str for k in value):
            raise _TooCostly
        out.append(f"d{len(value)}(")
        for k in sorted(value):
            _encode(k, out, budget)
            _encode(value[k], out, budget)
        out.append(")")
    elif t is set or t is frozenset:
        items = []
        for item in value:
            sub: list[str] = []
            _encode(item, sub, budget)
            items.append("".join(sub))
        out.append(f"{'S' if t is set else 'F'}{len(items)}(")
        out.extend(sorted(items))
        out.append(")")
    else:
        raise _TooCostly


def describe(held: bytes, pushed: bytes) -> str | None:
    """What differs between two fingerprints: "function", "arguments" or
    None (the same, as far as both can tell)."""
    if held[:8] != pushed[:8]:
        return "function"
    if len(held) == 16 and len(pushed) == 16 and held != pushed:
        return "arguments"
    return None
