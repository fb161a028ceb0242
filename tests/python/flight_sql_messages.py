"""The Flight and Flight SQL protobuf messages the raw pyarrow.flight tests speak, encoded and
decoded by hand, as a client in a language without a Flight SQL library would do it.

Varints, 64-bit fixed fields and length-delimited fields are all these messages need. A map
field is a repeated length-delimited entry {key = 1, value = 2}. Flight SQL commands and actions
travel inside google.protobuf.Any{type_url = 1, value = 2}; Flight's own session actions
(SetSessionOptions, GetSessionOptions, CloseSession) carry their message bare.
"""

import struct

import pyarrow.flight as flight

SQL_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."

# SetSessionOptionsResult.ErrorValue
INVALID_NAME, INVALID_VALUE, ERROR = 1, 2, 3
# CloseSessionResult.Status
CLOSED = 1


# --- Wire format ---

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def varint_field(field, n):
    return varint(field << 3 | 0) + varint(n)


def fixed64_field(field, payload):
    """An 8-byte little-endian field (sfixed64, double)."""
    assert len(payload) == 8
    return varint(field << 3 | 1) + payload


def length_delimited(field, payload):
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def decode_fields(data):
    """{field number: [values]}: ints for varints, bytes for the other wire types."""
    fields, i = {}, 0

    def read_varint():
        nonlocal i
        n, shift = 0, 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(data):
        key = read_varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            value = read_varint()
        elif wire == 2:
            n = read_varint()
            value, i = bytes(data[i:i + n]), i + n
        elif wire == 1:
            value, i = bytes(data[i:i + 8]), i + 8
        elif wire == 5:
            value, i = bytes(data[i:i + 4]), i + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        fields.setdefault(field, []).append(value)
    return fields


def decode_map(data, field=1):
    """A map field of `data` as {key: value bytes} (keys are strings in every map here)."""
    entries = {}
    for entry in decode_fields(data).get(field, []):
        parts = decode_fields(entry)
        entries[parts.get(1, [b""])[0].decode()] = parts.get(2, [b""])[0]
    return entries


def any_message(type_name, value):
    """google.protobuf.Any{type_url = 1, value = 2} of a Flight SQL message."""
    return length_delimited(1, SQL_PREFIX + type_name) + length_delimited(2, value)


def any_value(data, type_name):
    """The value of an Any, checked to be a `type_name`."""
    fields = decode_fields(data)
    assert fields[1][0].decode() == SQL_PREFIX + type_name, fields[1][0]
    return fields.get(2, [b""])[0]


# --- Flight SQL statements ---

def in_transaction(transaction_id):
    """The transaction_id (2) field of a statement, if it names one."""
    return length_delimited(2, transaction_id) if transaction_id is not None else b""


def statement_query(sql, transaction_id=None):
    """A descriptor for CommandStatementQuery{query = 1, transaction_id = 2}."""
    body = length_delimited(1, sql) + in_transaction(transaction_id)
    return flight.FlightDescriptor.for_command(any_message("CommandStatementQuery", body))


def statement_update(sql, transaction_id=None):
    """A descriptor for CommandStatementUpdate{query = 1, transaction_id = 2}."""
    body = length_delimited(1, sql) + in_transaction(transaction_id)
    return flight.FlightDescriptor.for_command(any_message("CommandStatementUpdate", body))


def begin_transaction():
    """The action ActionBeginTransactionRequest{}."""
    return flight.Action("BeginTransaction", any_message("ActionBeginTransactionRequest", b""))


def transaction_id(result_body):
    """transaction_id (1) of an ActionBeginTransactionResult in an Any."""
    return decode_fields(any_value(result_body, "ActionBeginTransactionResult"))[1][0]


END_COMMIT, END_ROLLBACK = 1, 2


def end_transaction(transaction_id, action):
    """The action ActionEndTransactionRequest{transaction_id = 1, action = 2}."""
    body = length_delimited(1, transaction_id) + varint_field(2, action)
    return flight.Action("EndTransaction", any_message("ActionEndTransactionRequest", body))


def create_prepared_statement(sql):
    """The action ActionCreatePreparedStatementRequest{query = 1}."""
    body = any_message("ActionCreatePreparedStatementRequest", length_delimited(1, sql))
    return flight.Action("CreatePreparedStatement", body)


def prepared_statement_handle(result_body):
    """prepared_statement_handle (1) of an ActionCreatePreparedStatementResult in an Any."""
    return decode_fields(any_value(result_body, "ActionCreatePreparedStatementResult"))[1][0]


def close_prepared_statement(handle):
    """The action ActionClosePreparedStatementRequest{prepared_statement_handle = 1}."""
    body = any_message("ActionClosePreparedStatementRequest", length_delimited(1, handle))
    return flight.Action("ClosePreparedStatement", body)


def prepared_statement_query(handle):
    """A descriptor for CommandPreparedStatementQuery{prepared_statement_handle = 1}."""
    command = any_message("CommandPreparedStatementQuery", length_delimited(1, handle))
    return flight.FlightDescriptor.for_command(command)


def prepared_statement_update(handle):
    """A descriptor for CommandPreparedStatementUpdate{prepared_statement_handle = 1}."""
    command = any_message("CommandPreparedStatementUpdate", length_delimited(1, handle))
    return flight.FlightDescriptor.for_command(command)


def ticket_statement_query(handle):
    """A ticket for TicketStatementQuery{statement_handle = 1}."""
    return flight.Ticket(any_message("TicketStatementQuery", length_delimited(1, handle)))


# TableDefinitionOptions.TableNotExistOption and .TableExistsOption
NOT_EXIST_CREATE, NOT_EXIST_FAIL = 1, 2
EXISTS_FAIL, EXISTS_APPEND, EXISTS_REPLACE = 1, 2, 3


def statement_ingest(table, if_not_exist=NOT_EXIST_FAIL, if_exists=EXISTS_APPEND):
    """A descriptor for CommandStatementIngest{TableDefinitionOptions{if_not_exist = 1,
    if_exists = 2} table_definition_options = 1, table = 2}."""
    options = varint_field(1, if_not_exist) + varint_field(2, if_exists)
    command = length_delimited(1, options) + length_delimited(2, table)
    return flight.FlightDescriptor.for_command(any_message("CommandStatementIngest", command))


# --- Flight session options ---

def session_option_value(value):
    """SessionOptionValue{string_value = 1 | bool_value = 2 | sfixed64 int64_value = 3 |
    double double_value = 4 | StringListValue{repeated string values = 1} string_list_value = 5}."""
    if isinstance(value, bool):
        return varint_field(2, int(value))
    if isinstance(value, int):
        return fixed64_field(3, struct.pack("<q", value))
    if isinstance(value, float):
        return fixed64_field(4, struct.pack("<d", value))
    if isinstance(value, str):
        return length_delimited(1, value)
    return length_delimited(5, b"".join(length_delimited(1, v) for v in value))


def decode_session_option_value(data):
    fields = decode_fields(data)
    if 1 in fields:
        return fields[1][0].decode()
    if 2 in fields:
        return bool(fields[2][0])
    if 3 in fields:
        return struct.unpack("<q", fields[3][0])[0]
    if 4 in fields:
        return struct.unpack("<d", fields[4][0])[0]
    if 5 in fields:
        return [v.decode() for v in decode_fields(fields[5][0]).get(1, [])]
    return None


def set_session_options(options):
    """The action SetSessionOptionsRequest{map<string, SessionOptionValue> session_options = 1}."""
    body = b"".join(
        length_delimited(1, length_delimited(1, name) + length_delimited(2, session_option_value(value)))
        for name, value in options.items()
    )
    return flight.Action("SetSessionOptions", body)


def set_session_options_errors(result_body):
    """SetSessionOptionsResult{map<string, Error{ErrorValue value = 1}> errors = 1} as
    {name: ErrorValue}."""
    return {name: decode_fields(error).get(1, [0])[0] for name, error in decode_map(result_body).items()}


def get_session_options():
    """The action GetSessionOptionsRequest{}."""
    return flight.Action("GetSessionOptions", b"")


def session_options(result_body):
    """GetSessionOptionsResult{map<string, SessionOptionValue> session_options = 1} as a dict."""
    return {name: decode_session_option_value(value) for name, value in decode_map(result_body).items()}


def close_session():
    """The action CloseSessionRequest{}."""
    return flight.Action("CloseSession", b"")


def close_session_status(result_body):
    """status (1) of a CloseSessionResult."""
    return decode_fields(result_body).get(1, [0])[0]
