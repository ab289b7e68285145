"""The protobuf wire format, read by hand: enough for the two messages albert_hf reads without the protobuf
package, a SentencePiece model (tokenization.py) and TensorFlow's checkpoint entries (convert/tf_checkpoint.py)."""


def varint(data, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if position >= len(data):
            raise IndexError("varint runs past the end of its buffer")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, position


def proto_fields(data):
    """(field number, value) of a serialized protobuf message: ints for varints, bytes for the other wire types."""
    position = 0
    while position < len(data):
        key, position = varint(data, position)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = varint(data, position)
        elif wire_type == 1:
            value, position = bytes(data[position : position + 8]), position + 8
        elif wire_type == 2:
            length, position = varint(data, position)
            value, position = bytes(data[position : position + length]), position + length
        elif wire_type == 5:
            value, position = bytes(data[position : position + 4]), position + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type}")
        if position > len(data):
            raise ValueError("protobuf field runs past the end of its message")
        yield field, value
