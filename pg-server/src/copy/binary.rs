//! PostgreSQL's binary COPY format: a header (an 11-byte signature, 32-bit flags, a 32-bit
//! length and that many bytes of extension), then per tuple a 16-bit field count and per field
//! a 32-bit length (-1 for NULL) and the value in its type's binary send form, then a count of
//! -1 as the trailer; every number big-endian.
//!
//! Copied in, each field is read as its column's type, which the client must have sent: its
//! bytes say nothing of their type. Integers are read by their length (an `int4` fits a
//! BIGINT column); anything else of the wrong length is an error, as is every other way the
//! client's bytes can be short or wrong. Copied out, `arrow-pg` writes the values through
//! pgwire's binary copy encoder.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Decimal128Array, Float32Array, Float64Array, Int32Array,
    Int64Array, StringArray,
};
use arrow::compute::CastOptions;
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use futures::{Stream, StreamExt};
use nyala_server::ServerError;
use nyala_sql::SqlError;
use pgwire::api::results::{CopyResponse, FieldFormat, FieldInfo};
use pgwire::error::PgWireResult;
use pgwire::messages::copy::CopyData;

/// What every binary COPY starts with.
const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";
/// The signature, then the flags and the header extension's length, both 0.
const HEADER: [u8; 19] = *b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// The tuple count that ends the data.
const TRAILER: [u8; 2] = (-1i16).to_be_bytes();
/// Days from 1970-01-01 (Arrow's dates) to 2000-01-01 (PostgreSQL's).
const POSTGRES_EPOCH_DAYS: i32 = 10_957;
/// The same in microseconds, as timestamps count.
const POSTGRES_EPOCH_MICROS: i64 = POSTGRES_EPOCH_DAYS as i64 * 86_400_000_000;

/// The columns of `data`, a binary COPY's bytes, one per field of `schema`.
pub(super) fn columns(data: &[u8], schema: &Schema) -> Result<Vec<ArrayRef>, ServerError> {
    let fields = tuples(data, schema.fields().len()).map_err(ServerError::invalid)?;
    (schema.fields().iter().zip(&fields))
        .map(|(field, values)| column(field, values))
        .collect()
}

/// The fields of the tuples of `data`, column by column (None for NULL).
fn tuples(data: &[u8], width: usize) -> Result<Vec<Vec<Option<&[u8]>>>, String> {
    let mut data = Reader(data);
    let header = |e: String| format!("COPY binary header: {e}");
    if data.take(SIGNATURE.len()).map_err(header)? != SIGNATURE {
        return Err("COPY data is not in binary format: its signature is missing".into());
    }
    // The high 16 bits are flags a reader must know (bit 16: OIDs follow); the low ones may
    // be ignored.
    let flags = data.i32().map_err(header)? as u32;
    if flags >> 16 != 0 {
        return Err(format!("COPY binary header: unsupported flags {flags:#x}"));
    }
    let extension = data.i32().map_err(header)?;
    let extension = usize::try_from(extension)
        .map_err(|_| header(format!("invalid extension length {extension}")))?;
    data.take(extension).map_err(header)?;
    let mut columns = vec![Vec::new(); width];
    // PostgreSQL also takes data that ends after a tuple without the trailer.
    for tuple in 1.. {
        if data.0.is_empty() {
            break;
        }
        let in_tuple = |e: String| format!("COPY tuple {tuple}: {e}");
        let count = data.i16().map_err(in_tuple)?;
        if count == -1 {
            break;
        }
        if usize::try_from(count) != Ok(width) {
            return Err(in_tuple(format!(
                "{count} fields where the table's columns copied are {width}"
            )));
        }
        for column in &mut columns {
            column.push(data.field().map_err(in_tuple)?);
        }
    }
    match data.0.is_empty() {
        true => Ok(columns),
        false => Err("COPY data continues after the binary trailer".into()),
    }
}

/// Big-endian reads from the front of a COPY's bytes; running out is an error.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err(format!("{n} bytes expected where {} remain", self.0.len()));
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let taken = self.take(N)?;
        taken.try_into().map_err(|_| format!("{N} bytes expected"))
    }

    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    /// A field's bytes, None for NULL.
    fn field(&mut self) -> Result<Option<&'a [u8]>, String> {
        let length = self.i32()?;
        if length == -1 {
            return Ok(None);
        }
        let length =
            usize::try_from(length).map_err(|_| format!("invalid field length {length}"))?;
        self.take(length).map(Some)
    }
}

/// `values`, a column's fields as sent, as an array of `field`'s type.
fn column(field: &Field, values: &[Option<&[u8]>]) -> Result<ArrayRef, ServerError> {
    let column_error =
        |e: String| ServerError::invalid(format!("COPY column {}: {e}", field.name()));
    let Some(array) = decoded_column(field.data_type(), values).map_err(column_error)? else {
        return Err(SqlError::NotSupported(format!(
            "COPY in binary format into column {} of type {}",
            field.name(),
            field.data_type()
        ))
        .into());
    };
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    arrow::compute::cast_with_options(&array, field.data_type(), &options)
        .map_err(|e| column_error(e.to_string()))
}

/// `values` decoded as `data_type` is sent, in an array that casts to it; None for a type
/// not read in binary.
fn decoded_column(
    data_type: &DataType,
    values: &[Option<&[u8]>],
) -> Result<Option<ArrayRef>, String> {
    let array: ArrayRef = match data_type {
        DataType::Boolean => Arc::new(BooleanArray::from(decoded(values, |bytes| {
            Ok(u8::from_be_bytes(exact(bytes)?) != 0)
        })?)),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            Arc::new(Int64Array::from(decoded(values, integer)?))
        }
        DataType::Float32 => Arc::new(Float32Array::from(decoded(values, |bytes| {
            Ok(f32::from_be_bytes(exact(bytes)?))
        })?)),
        DataType::Float64 => Arc::new(Float64Array::from(decoded(values, |bytes| {
            Ok(f64::from_be_bytes(exact(bytes)?))
        })?)),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            Arc::new(StringArray::from(decoded(values, |bytes| {
                std::str::from_utf8(bytes).map_err(|e| format!("invalid UTF-8: {e}"))
            })?))
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            Arc::new(BinaryArray::from(values.to_vec()))
        }
        DataType::Date32 => Arc::new(Int32Array::from(decoded(values, date)?)),
        DataType::Timestamp(unit, _) => Arc::new(Int64Array::from(decoded(values, |bytes| {
            timestamp(bytes, *unit)
        })?)),
        DataType::Decimal128(precision, scale) => {
            let decimals = Decimal128Array::from(decoded(values, |b| numeric(b, *scale))?)
                .with_precision_and_scale(*precision, *scale)
                .map_err(|e| e.to_string())?;
            decimals
                .validate_decimal_precision(*precision)
                .map_err(|e| e.to_string())?;
            Arc::new(decimals)
        }
        _ => return Ok(None),
    };
    Ok(Some(array))
}

/// Each of `values` decoded (NULLs kept); an error names the tuple.
fn decoded<'a, T>(
    values: &[Option<&'a [u8]>],
    decode: impl Fn(&'a [u8]) -> Result<T, String>,
) -> Result<Vec<Option<T>>, String> {
    (values.iter().enumerate())
        .map(|(row, value)| {
            let decoded = value.map(&decode).transpose();
            decoded.map_err(|e| format!("tuple {}: {e}", row + 1))
        })
        .collect()
}

/// A value's bytes when there are exactly `N` of them.
fn exact<const N: usize>(bytes: &[u8]) -> Result<[u8; N], String> {
    bytes
        .try_into()
        .map_err(|_| format!("{} bytes where {N} were expected", bytes.len()))
}

/// An `int2`, `int4` or `int8`, told apart by their lengths.
fn integer(bytes: &[u8]) -> Result<i64, String> {
    match *bytes {
        [a, b] => Ok(i16::from_be_bytes([a, b]).into()),
        [a, b, c, d] => Ok(i32::from_be_bytes([a, b, c, d]).into()),
        [a, b, c, d, e, f, g, h] => Ok(i64::from_be_bytes([a, b, c, d, e, f, g, h])),
        _ => Err(format!("{} bytes are not an integer", bytes.len())),
    }
}

/// A `date`, days since 2000-01-01, as days since 1970-01-01.
fn date(bytes: &[u8]) -> Result<i32, String> {
    let days = i32::from_be_bytes(exact(bytes)?);
    (days.checked_add(POSTGRES_EPOCH_DAYS)).ok_or_else(|| format!("date out of range: {days}"))
}

/// A `timestamp` or `timestamptz`, microseconds since 2000-01-01 00:00:00 (UTC for the
/// latter), in `unit` since 1970-01-01 (sub-`unit` digits dropped).
fn timestamp(bytes: &[u8], unit: TimeUnit) -> Result<i64, String> {
    let micros = i64::from_be_bytes(exact(bytes)?);
    let since_1970 = micros.checked_add(POSTGRES_EPOCH_MICROS);
    let in_unit = since_1970.and_then(|micros| match unit {
        TimeUnit::Second => Some(micros.div_euclid(1_000_000)),
        TimeUnit::Millisecond => Some(micros.div_euclid(1_000)),
        TimeUnit::Microsecond => Some(micros),
        TimeUnit::Nanosecond => micros.checked_mul(1_000),
    });
    in_unit.ok_or_else(|| format!("timestamp out of range: {micros}"))
}

/// A `numeric` (digit count, weight of the first digit, sign, display scale, then base-10000
/// digits) as an integer of `scale` decimal places, rounded half away from zero as PostgreSQL
/// rounds into a column's scale.
fn numeric(bytes: &[u8], scale: i8) -> Result<i128, String> {
    let mut bytes = Reader(bytes);
    let (ndigits, weight) = (bytes.i16()?, bytes.i16()?);
    let (sign, _display_scale) = (bytes.i16()? as u16, bytes.i16()?);
    let negative = match sign {
        0x0000 => false,
        0x4000 => true,
        0xC000 => return Err("NaN does not fit a DECIMAL".into()),
        _ => return Err(format!("invalid numeric sign {sign:#x}")),
    };
    let too_large = || "the numeric does not fit a DECIMAL".to_string();
    let mut digits: i128 = 0;
    for _ in 0..ndigits {
        let digit = bytes.i16()?;
        if !(0..10_000).contains(&digit) {
            return Err(format!("invalid numeric digit {digit}"));
        }
        digits = (digits.checked_mul(10_000))
            .and_then(|d| d.checked_add(digit.into()))
            .ok_or_else(too_large)?;
    }
    if !bytes.0.is_empty() {
        return Err("numeric longer than its digits".into());
    }
    if digits == 0 {
        return Ok(0);
    }
    // `digits` is the value times 10000^(ndigits - 1 - weight).
    let exponent = 4 * (i32::from(weight) + 1 - i32::from(ndigits)) + i32::from(scale);
    let scaled = match u32::try_from(exponent) {
        Ok(up) => (10i128.checked_pow(up))
            .and_then(|factor| digits.checked_mul(factor))
            .ok_or_else(too_large)?,
        Err(_) => match 10i128.checked_pow(exponent.unsigned_abs()) {
            Some(divisor) => {
                let remainder = digits % divisor;
                digits / divisor + i128::from(remainder >= divisor - remainder)
            }
            None => 0,
        },
    };
    Ok(if negative { -scaled } else { scaled })
}

/// `fields` as a binary COPY writes them.
pub(super) fn fields(fields: &[FieldInfo]) -> Arc<Vec<FieldInfo>> {
    let binary = fields.iter().map(|field| {
        FieldInfo::new(
            field.name().to_string(),
            field.table_id(),
            field.column_id(),
            field.datatype().clone(),
            FieldFormat::Binary,
        )
        .with_format_options(field.format_options().clone())
    });
    Arc::new(binary.collect())
}

/// The response of a `COPY ... TO STDOUT` in binary, `rows` as pgwire's binary copy encoder
/// writes them (the header in front of the first), then the trailer. PostgreSQL sends the
/// header with the first row or, when there are none, with the trailer, and clients (psycopg,
/// tokio-postgres) read it so; pgwire's own response would end an empty copy with a trailer
/// and no header.
pub(super) fn response<S>(columns: usize, rows: S) -> CopyResponse
where
    S: Stream<Item = PgWireResult<CopyData>> + Send + 'static,
{
    let any_row = Arc::new(AtomicBool::new(false));
    let seen = any_row.clone();
    let rows = rows.inspect(move |_| seen.store(true, Ordering::Relaxed));
    let trailer = futures::stream::once(async move {
        let mut end = match any_row.load(Ordering::Relaxed) {
            true => Vec::new(),
            false => HEADER.to_vec(),
        };
        end.extend_from_slice(&TRAILER);
        let end: PgWireResult<CopyData> = Ok(CopyData::new(end.into()));
        end
    });
    let mut response = CopyResponse::new(1, columns, futures::stream::empty());
    response.data_stream = Box::pin(rows.chain(trailer));
    response
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray, RecordBatch};
    use arrow::datatypes::{Date32Type, Decimal128Type, Float64Type, Int64Type};
    use pgwire::api::portal::Format;
    use pgwire::api::results::CopyEncoder;
    use pgwire::types::format::FormatOptions;

    use super::*;

    /// A binary COPY of `rows` (None for NULL), with its header and trailer.
    fn payload(rows: &[Vec<Option<Vec<u8>>>]) -> Vec<u8> {
        let mut data = HEADER.to_vec();
        for row in rows {
            data.extend((row.len() as i16).to_be_bytes());
            for field in row {
                match field {
                    None => data.extend((-1i32).to_be_bytes()),
                    Some(bytes) => {
                        data.extend((bytes.len() as i32).to_be_bytes());
                        data.extend(bytes);
                    }
                }
            }
        }
        data.extend(TRAILER);
        data
    }

    /// A `numeric`'s binary form.
    fn numeric_bytes(weight: i16, sign: u16, digits: &[i16]) -> Vec<u8> {
        let mut bytes = (digits.len() as i16).to_be_bytes().to_vec();
        bytes.extend(weight.to_be_bytes());
        bytes.extend(sign.to_be_bytes());
        bytes.extend(2i16.to_be_bytes());
        digits.iter().for_each(|d| bytes.extend(d.to_be_bytes()));
        bytes
    }

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
            Field::new("v", DataType::Float64, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("d", DataType::Date32, true),
            Field::new("n", DataType::Decimal128(10, 2), true),
        ])
    }

    fn some(bytes: impl AsRef<[u8]>) -> Option<Vec<u8>> {
        Some(bytes.as_ref().to_vec())
    }

    /// Three rows, their keys sent as `int8`, `int4` and `int2`.
    fn rows() -> Vec<Vec<Option<Vec<u8>>>> {
        vec![
            vec![
                some(1i64.to_be_bytes()),
                some("héllo"),
                some(2.5f64.to_be_bytes()),
                some([1u8]),
                some(8767i32.to_be_bytes()),
                some(numeric_bytes(0, 0x0000, &[12, 3400])),
            ],
            vec![
                some(2i32.to_be_bytes()),
                None,
                some((-1.0f64).to_be_bytes()),
                some([0u8]),
                some(0i32.to_be_bytes()),
                some(numeric_bytes(-1, 0x4000, &[5000])),
            ],
            vec![
                some(3i16.to_be_bytes()),
                some(""),
                None,
                None,
                None,
                some(numeric_bytes(1, 0x0000, &[10])),
            ],
        ]
    }

    #[test]
    fn tuples_are_read_as_their_columns_types() {
        let columns = columns(&payload(&rows()), &schema()).unwrap();
        let keys = columns[0].as_primitive::<Int64Type>();
        assert_eq!(keys.values().to_vec(), vec![1, 2, 3]);
        let s = columns[1].as_string::<i32>();
        assert_eq!((s.value(0), s.is_null(1), s.value(2)), ("héllo", true, ""));
        let v = columns[2].as_primitive::<Float64Type>();
        assert_eq!((v.value(0), v.value(1), v.is_null(2)), (2.5, -1.0, true));
        let b = columns[3].as_boolean();
        assert_eq!((b.value(0), b.value(1), b.is_null(2)), (true, false, true));
        let d = columns[4].as_primitive::<Date32Type>();
        assert_eq!(
            (d.value(0), d.value(1), d.is_null(2)),
            (19_724, 10_957, true)
        );
        let n = columns[5].as_primitive::<Decimal128Type>();
        assert_eq!(n.data_type(), &DataType::Decimal128(10, 2));
        assert_eq!(n.values().to_vec(), vec![1234, -50, 10_000_000]);
    }

    #[test]
    fn numerics_are_rounded_to_the_column_scale_and_must_fit() {
        // 1.005 and -1.005 (digits 1 and 0050 after the point) at scale 2.
        assert_eq!(numeric(&numeric_bytes(0, 0x0000, &[1, 50]), 2), Ok(101));
        assert_eq!(numeric(&numeric_bytes(0, 0x4000, &[1, 50]), 2), Ok(-101));
        assert_eq!(numeric(&numeric_bytes(-3, 0x0000, &[1]), 2), Ok(0));
        assert!(numeric(&numeric_bytes(0, 0xC000, &[]), 2).is_err());
        assert!(numeric(&numeric_bytes(20, 0x0000, &[1]), 2).is_err());
        let schema = Schema::new(vec![Field::new("n", DataType::Decimal128(4, 2), true)]);
        let too_wide = payload(&[vec![some(numeric_bytes(0, 0, &[123]))]]);
        assert!(columns(&too_wide, &schema).is_err());
    }

    #[test]
    fn timestamps_are_read_in_the_column_unit() {
        let schema = Schema::new(vec![Field::new(
            "t",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        )]);
        let data = payload(&[vec![some(1_500i64.to_be_bytes())]]);
        let columns = columns(&data, &schema).unwrap();
        assert_eq!(columns[0].data_type(), schema.field(0).data_type());
        let t = arrow::compute::cast(&columns[0], &DataType::Int64).unwrap();
        assert_eq!(t.as_primitive::<Int64Type>().value(0), 946_684_800_001);
    }

    #[test]
    fn bad_data_is_an_error_never_a_panic() {
        let schema = schema();
        let data = payload(&rows());
        for end in 0..data.len() {
            // Data cut between tuples is whole rows without the trailer, as PostgreSQL reads it.
            let _ = columns(&data[..end], &schema);
        }
        let error = |data: &[u8], schema: &Schema| columns(data, schema).unwrap_err().to_string();
        assert!(error(&data[..HEADER.len() + 5], &schema).contains("tuple 1"));
        assert!(error(b"PGCOPY\n".as_slice(), &schema).contains("header"));
        assert!(error(b"COPY t\n1\t2\n\\.\n".as_slice(), &schema).contains("signature"));
        let short = payload(&[vec![some(1i64.to_be_bytes())]]);
        let e = error(&short, &schema);
        assert!(e.contains("tuple 1") && e.contains("1 fields"), "{e}");
        let mut bad_text = rows();
        bad_text[1][1] = some([0xffu8, 0xfe]);
        let e = error(&payload(&bad_text), &schema);
        assert!(e.contains("column s") && e.contains("tuple 2"), "{e}");
        let mut bad_float = rows();
        bad_float[0][2] = some(2.5f32.to_be_bytes());
        assert!(error(&payload(&bad_float), &schema).contains("column v"));
        let mut after_trailer = data.clone();
        after_trailer.push(0);
        assert!(error(&after_trailer, &schema).contains("trailer"));

        let int4 = Schema::new(vec![Field::new("i", DataType::Int32, true)]);
        let too_big = payload(&[vec![some((1i64 << 40).to_be_bytes())]]);
        assert!(error(&too_big, &int4).contains("column i"));
        let time = Schema::new(vec![Field::new(
            "t",
            DataType::Time64(TimeUnit::Microsecond),
            true,
        )]);
        let e = error(&payload(&[vec![some(0i64.to_be_bytes())]]), &time);
        assert!(e.contains("column t of type Time64"), "{e}");
    }

    #[test]
    fn what_is_copied_out_reads_back() {
        let schema = Arc::new(schema());
        let batch =
            RecordBatch::try_new(schema.clone(), columns(&payload(&rows()), &schema).unwrap())
                .unwrap();
        let options = Arc::new(FormatOptions::default());
        let text_fields =
            crate::results::pg_fields(&schema, &Format::UnifiedText, options).unwrap();
        let fields = fields(&text_fields);
        let mut encoder = CopyEncoder::new_binary(fields.clone());
        let copied = super::super::encode(&mut encoder, &fields, &batch).unwrap();
        let mut data: Vec<u8> = copied.iter().flat_map(|row| row.data.to_vec()).collect();
        data.extend(TRAILER);
        assert_eq!(columns(&data, &schema).unwrap().as_slice(), batch.columns());
    }

    #[test]
    fn an_empty_copy_out_has_a_header() {
        let response = response(1, futures::stream::empty());
        let sent = futures::executor::block_on(response.data_stream.collect::<Vec<_>>());
        let sent: Vec<Vec<u8>> = sent.into_iter().map(|m| m.unwrap().data.to_vec()).collect();
        assert_eq!(sent, vec![[HEADER.as_slice(), TRAILER.as_slice()].concat()]);
        assert!(columns(&sent[0], &schema())
            .unwrap()
            .iter()
            .all(|c| c.is_empty()));
    }
}
