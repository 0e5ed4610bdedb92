"""The Chakra execution-trace schema, and the file format its tools write.

A Chakra execution trace (ET) is one file per rank: a stream of protobuf messages, each
preceded by its length as a varint (the framing of Chakra's ``protolib.encodeMessage``
and ASTRA-sim's ET feeder). The first message is a ``GlobalMetadata``; every one after it
is a ``Node``. The messages are those of ``schema/protobuf/et_def.proto`` in
mlcommons/chakra (package ``ChakraProtoMsg``): written here from that published schema,
with its field numbers and enum values, and built into a descriptor when first needed
(``messages``), so no code is generated and no ``protoc`` is needed. The descriptor lives in
a pool of its own, so a process that also imports Chakra's generated ``et_def_pb2`` sees no
clash of names.

The ``protobuf`` package is an optional extra (``pip install 'trainsim[chakra]'``); without
it, ``messages`` raises an ``InputError`` saying how to install it.

Units at this boundary are Chakra's: ``duration_micros`` in whole microseconds and
``comm_size`` in bytes; ``sim.inputs.chakra`` and ``sim.results.export_chakra`` convert
once, to and from seconds and bytes.
"""

from __future__ import annotations

import gzip
from functools import lru_cache
from types import SimpleNamespace

from sim.errors import InputError

PACKAGE = "ChakraProtoMsg"

NODE_TYPES = {"INVALID_NODE": 0, "METADATA_NODE": 1, "MEM_LOAD_NODE": 2, "MEM_STORE_NODE": 3, "COMP_NODE": 4,
              "COMM_SEND_NODE": 5, "COMM_RECV_NODE": 6, "COMM_COLL_NODE": 7}
"""``NodeType`` of et_def.proto."""
COMM_TYPES = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4, "BROADCAST": 5,
              "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7, "REDUCE_SCATTER_BLOCK": 8, "BARRIER": 9}
"""``CollectiveCommType`` of et_def.proto."""

_LISTS = [("DoubleList", "double"), ("FloatList", "float"), ("Int32List", "int32"), ("Int64List", "int64"),
          ("Uint32List", "uint32"), ("Uint64List", "uint64"), ("Sint32List", "sint32"), ("Sint64List", "sint64"),
          ("Fixed32List", "fixed32"), ("Fixed64List", "fixed64"), ("Sfixed32List", "sfixed32"),
          ("Sfixed64List", "sfixed64"), ("BoolList", "bool"), ("StringList", "string"), ("BytesList", "bytes")]
"""The list messages, each ``repeated <type> values = 1``, in the order of et_def.proto."""

# (name, number, label, type) per message; a type that is not a scalar names a message or enum.
_MESSAGES = {
    "GlobalMetadata": [("version", 1, "optional", "string"), ("attr", 2, "repeated", "AttributeProto")],
    "Node": [("id", 1, "optional", "uint64"), ("name", 2, "optional", "string"), ("type", 3, "optional", "NodeType"),
             ("ctrl_deps", 4, "repeated", "uint64"), ("data_deps", 5, "repeated", "uint64"),
             ("start_time_micros", 6, "optional", "uint64"), ("duration_micros", 7, "optional", "uint64"),
             ("inputs", 8, "optional", "IOInfo"), ("outputs", 9, "optional", "IOInfo"),
             ("attr", 10, "repeated", "AttributeProto")],
    "IOInfo": [("values", 1, "optional", "string"), ("shapes", 2, "optional", "string"),
               ("types", 3, "optional", "string")],
    "Tensor": [("tensor_id", 1, "optional", "uint64"), ("storage_id", 2, "optional", "uint64"),
               ("offset", 3, "optional", "uint64"), ("num_elem", 4, "optional", "uint64"),
               ("elem_bytes", 5, "optional", "uint64"), ("device", 6, "optional", "string")],
}
# AttributeProto: name = 1, doc_string = 2, then oneof value: for each list message, its
# scalar (<type>_val) and its list (<type>_list), numbered 3, 4, 5, ... in that order.
_ATTRIBUTE_VALUES = [(f"{t}_val" if i % 2 == 0 else f"{t}_list", 3 + 2 * k + i, t if i % 2 == 0 else list_name)
                     for k, (list_name, t) in enumerate(_LISTS) for i in (0, 1)]


@lru_cache(maxsize=1)
def messages() -> SimpleNamespace:
    """The message classes (``GlobalMetadata``, ``Node``, ``AttributeProto``, ``IOInfo``,
    the list messages), built once from the schema above."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise InputError("protobuf: not installed; Chakra execution traces are protobuf files. "
                         "Install the extra: pip install 'trainsim[chakra]'") from None
    F = descriptor_pb2.FieldDescriptorProto
    scalar = {"double": F.TYPE_DOUBLE, "float": F.TYPE_FLOAT, "int32": F.TYPE_INT32, "int64": F.TYPE_INT64,
              "uint32": F.TYPE_UINT32, "uint64": F.TYPE_UINT64, "sint32": F.TYPE_SINT32, "sint64": F.TYPE_SINT64,
              "fixed32": F.TYPE_FIXED32, "fixed64": F.TYPE_FIXED64, "sfixed32": F.TYPE_SFIXED32,
              "sfixed64": F.TYPE_SFIXED64, "bool": F.TYPE_BOOL, "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES}
    enums = {"NodeType": NODE_TYPES, "CollectiveCommType": COMM_TYPES}
    fd = descriptor_pb2.FileDescriptorProto(name="trainsim/chakra/et_def.proto", package=PACKAGE, syntax="proto3")

    def add_field(msg, name: str, number: int, label: str, type_: str, oneof: int | None = None) -> None:
        f = msg.field.add(name=name, number=number,
                          label=F.LABEL_REPEATED if label == "repeated" else F.LABEL_OPTIONAL)
        if type_ in scalar:
            f.type = scalar[type_]
        else:
            f.type = F.TYPE_ENUM if type_ in enums else F.TYPE_MESSAGE
            f.type_name = f".{PACKAGE}.{type_}"
        if oneof is not None:
            f.oneof_index = oneof

    attr = fd.message_type.add(name="AttributeProto")
    add_field(attr, "name", 1, "optional", "string")
    add_field(attr, "doc_string", 2, "optional", "string")
    attr.oneof_decl.add(name="value")
    for name, number, type_ in _ATTRIBUTE_VALUES:
        add_field(attr, name, number, "optional", type_, oneof=0)
    for list_name, type_ in _LISTS:
        add_field(fd.message_type.add(name=list_name), "values", 1, "repeated", type_)
    for msg_name, fields in _MESSAGES.items():
        msg = fd.message_type.add(name=msg_name)
        for field in fields:
            add_field(msg, *field)
    for enum_name, values in enums.items():
        e = fd.enum_type.add(name=enum_name)
        for name, number in values.items():
            e.value.add(name=name, number=number)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    names = ["AttributeProto", *(n for n, _ in _LISTS), *_MESSAGES]
    # (GetMessageClass since protobuf 4.22; MessageFactory.GetPrototype before it, removed in 5)
    make = getattr(message_factory, "GetMessageClass", None) or message_factory.MessageFactory(pool).GetPrototype
    return SimpleNamespace(**{n: make(pool.FindMessageTypeByName(f"{PACKAGE}.{n}")) for n in names})


# ---------------------------------------------------------------- framing

def encode_stream(msgs) -> bytes:
    """The messages as one ET file's bytes: each serialized, after its length as a varint."""
    out = bytearray()
    for m in msgs:
        body = m.SerializeToString(deterministic=True)
        n = len(body)
        while True:
            byte = n & 0x7F
            n >>= 7
            if n:
                out.append(0x80 | byte)
            else:
                out.append(byte)
                break
        out += body
    return bytes(out)


class FramingError(ValueError):
    """The bytes are not a stream of length-prefixed messages (``detail`` says where)."""

    def __init__(self, detail: str):
        super().__init__(detail)
        self.detail = detail


def split_stream(data: bytes) -> list[bytes]:
    """The message bodies of an ET file's bytes (``iter_stream``, all of them)."""
    return list(iter_stream(data))


def iter_stream(data: bytes):
    """Yield the message bodies of an ET file's bytes in order (gzip-compressed files are
    opened, as Chakra's ``protolib.openFileRd`` does). A length that runs past the end, or
    a varint longer than ten bytes, raises a ``FramingError`` when reached, so a reader
    that checks each message as it comes reports the first wrong one."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise FramingError(f"gzip data that does not open ({exc})") from None
    count, pos, end = 0, 0, len(data)
    while pos < end:
        start, n, shift = pos, 0, 0
        while True:
            if pos >= end:
                raise FramingError(f"message {count}: its length prefix at byte {start} is cut off "
                                   "(the file is truncated)")
            byte = data[pos]
            pos += 1
            n |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift >= 70:
                raise FramingError(f"message {count}: no length prefix at byte {start}")
        if pos + n > end:
            raise FramingError(f"message {count} at byte {start}: {n} bytes announced, {end - pos} left "
                               f"(the file is truncated)")
        yield data[pos:pos + n]
        count += 1
        pos += n
