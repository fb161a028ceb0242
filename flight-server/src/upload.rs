//! Uploads: the Arrow IPC messages a client sends with DoPut (bulk ingest, parameter rows) and
//! those of the parameter rows a ticket carries, decoded into record batches without trusting
//! a byte of them.
//!
//! arrow-ipc validates the arrays it builds (offsets, UTF-8, null counts: we never skip that),
//! but some malformed messages make it panic before it gets there — a buffer reaching past the
//! message body, a validity bitmap shorter than its array, a schema naming a type without its
//! parameters — and it allocates whatever size a compressed buffer declares. So each message's
//! header is checked first, against its body and the limits of [`crate::limits`]: buffers lie
//! inside the body, row counts and decompressed sizes are bounded, an LZ4 frame holds what it
//! declares, a dictionary does not grow past a batch's size. arrow-flight's decoder then reads
//! it, under `catch_unwind`: whatever panic is left in arrow ends the upload with an
//! InvalidArgument "malformed Arrow data" error instead of resetting the client's stream.
//!
//! ```ignore
//! # // Not compiled: a doctest cannot reach this crate-private type.
//! let mut upload = Upload::new(request.into_inner());
//! while let Some(batch) = upload.try_next().await? { /* a valid batch of upload.schema() */ }
//! ```

use std::collections::HashMap;
use std::io::Read;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use arrow::ipc::{root_as_message, CompressionType, MessageHeader};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::FlightData;
use futures::{Stream, StreamExt, TryStreamExt};
use nyala_storage::panics::{catch_quietly, panic_message};
use tonic::Status;

use crate::invalid;
use crate::limits::{MAX_BATCH_BYTES, MAX_BATCH_ROWS};

/// The record batches of uploaded IPC messages (see the module comment).
pub struct Upload {
    batches: FlightRecordBatchStream,
    /// Bytes of the batches let through to the decoder so far, decompressed.
    bytes: Arc<AtomicUsize>,
    /// arrow panicked on a message: its decoder's state is not to be trusted any more.
    broken: bool,
}

impl Upload {
    pub fn new<S>(messages: S) -> Self
    where
        S: Stream<Item = Result<FlightData, Status>> + Send + 'static,
    {
        let bytes = Arc::new(AtomicUsize::new(0));
        let mut checks = Checks {
            bytes: bytes.clone(),
            dictionaries: HashMap::new(),
        };
        let messages = messages
            // Some clients send the command descriptor in a message of its own, with no payload.
            .try_filter(|data| futures::future::ready(!data.data_header.is_empty()))
            .and_then(move |data| futures::future::ready(checks.check(&data).map(|()| data)))
            .map_err(FlightError::from);
        Self {
            batches: FlightRecordBatchStream::new_from_flight_data(messages),
            bytes,
            broken: false,
        }
    }

    /// An upload of messages at hand (the parameter rows a ticket carries).
    pub fn of_messages(messages: Vec<FlightData>) -> Self {
        Self::new(futures::stream::iter(messages.into_iter().map(Ok)))
    }

    /// The upload's schema, once its first message has been read.
    pub fn schema(&self) -> Option<&SchemaRef> {
        self.batches.schema()
    }

    /// Bytes of the record batches read so far, decompressed.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl Stream for Upload {
    type Item = Result<RecordBatch, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.broken {
            return Poll::Ready(None);
        }
        let batches = &mut this.batches;
        match catch_quietly(|| batches.poll_next_unpin(cx)) {
            Ok(poll) => poll.map(|next| next.map(|batch| batch.map_err(upload_error))),
            Err(panic) => {
                this.broken = true;
                let message = panic_message(panic.as_ref());
                tracing::info!(message, "arrow could not decode uploaded data");
                Poll::Ready(Some(Err(malformed(message))))
            }
        }
    }
}

fn malformed(problem: impl std::fmt::Display) -> Status {
    invalid(format!("malformed Arrow data: {problem}"))
}

fn upload_error(e: FlightError) -> Status {
    match e {
        FlightError::Tonic(status) => *status,
        FlightError::Arrow(e) => malformed(e),
        FlightError::DecodeError(message) | FlightError::ProtocolError(message) => {
            malformed(message)
        }
        e => malformed(e),
    }
}

/// The checks of each message before arrow-ipc reads it.
struct Checks {
    bytes: Arc<AtomicUsize>,
    /// Bytes of each dictionary, by id: a delta adds to its dictionary.
    dictionaries: HashMap<i64, usize>,
}

impl Checks {
    fn check(&mut self, data: &FlightData) -> Result<(), Status> {
        let message = root_as_message(&data.data_header)
            .map_err(|e| malformed(format!("unreadable message header: {e}")))?;
        match message.header_type() {
            MessageHeader::RecordBatch => {
                let batch = message
                    .header_as_record_batch()
                    .ok_or_else(|| malformed("a record batch message without its header"))?;
                let bytes = batch_bytes(batch, &data.data_body)?;
                self.bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            MessageHeader::DictionaryBatch => {
                let dictionary = message
                    .header_as_dictionary_batch()
                    .ok_or_else(|| malformed("a dictionary message without its header"))?;
                let batch = dictionary
                    .data()
                    .ok_or_else(|| malformed("a dictionary message without data"))?;
                let bytes = batch_bytes(batch, &data.data_body)?;
                let size = self.dictionaries.entry(dictionary.id()).or_default();
                *size = match dictionary.isDelta() {
                    true => size.saturating_add(bytes),
                    false => bytes,
                };
                if *size > MAX_BATCH_BYTES {
                    return Err(invalid(format!(
                        "dictionary {} grows to {size} bytes; at most {MAX_BATCH_BYTES} are allowed",
                        dictionary.id()
                    )));
                }
            }
            // arrow-ipc reads a schema (its panics are caught) and refuses other messages.
            _ => {}
        }
        Ok(())
    }
}

/// Checks the header of a record batch (or of a dictionary's data) against its message body
/// and the limits; the bytes its buffers take decompressed.
fn batch_bytes(batch: arrow::ipc::RecordBatch, body: &[u8]) -> Result<usize, Status> {
    rows(batch.length(), "a batch")?;
    for node in batch.nodes().iter().flat_map(|nodes| nodes.iter()) {
        rows(node.length(), "an array")?;
        if !(0..=node.length()).contains(&node.null_count()) {
            return Err(malformed(format!(
                "an array of {} rows with {} nulls",
                node.length(),
                node.null_count()
            )));
        }
    }
    let codec = batch.compression().map(|c| c.codec());
    let mut bytes = 0usize;
    for buffer in batch.buffers().iter().flat_map(|buffers| buffers.iter()) {
        let range = usize::try_from(buffer.offset())
            .ok()
            .zip(usize::try_from(buffer.length()).ok())
            .and_then(|(start, length)| Some(start..start.checked_add(length)?))
            .filter(|range| range.end <= body.len())
            .ok_or_else(|| {
                malformed(format!(
                    "a buffer of {} bytes at offset {} lies outside the message body of {} bytes",
                    buffer.length(),
                    buffer.offset(),
                    body.len()
                ))
            })?;
        let size = match codec {
            Some(codec) => decompressed_size(codec, &body[range])?,
            None => range.len(),
        };
        bytes = bytes.saturating_add(size);
    }
    if bytes > MAX_BATCH_BYTES {
        return Err(invalid(format!(
            "a batch of {bytes} bytes (decompressed); at most {MAX_BATCH_BYTES} are allowed \
             per batch: send smaller batches"
        )));
    }
    Ok(bytes)
}

/// Refuses a negative row count or one over [`MAX_BATCH_ROWS`].
fn rows(count: i64, what: &str) -> Result<(), Status> {
    match usize::try_from(count) {
        Err(_) => Err(malformed(format!("{what} of {count} rows"))),
        Ok(n) if n > MAX_BATCH_ROWS => Err(invalid(format!(
            "{what} of {n} rows was uploaded; at most {MAX_BATCH_ROWS} are allowed per batch: \
             send smaller batches"
        ))),
        Ok(_) => Ok(()),
    }
}

/// The size a compressed buffer declares in its first 8 bytes (little-endian; -1: stored
/// uncompressed), refused above [`MAX_BATCH_BYTES`]. An LZ4 frame is decompressed here, into
/// nothing, to check it holds no more than that: arrow-ipc reads a frame to its end whatever it
/// declares, so a small frame could expand without bound. ZSTD stops at the declared size.
fn decompressed_size(codec: CompressionType, buffer: &[u8]) -> Result<usize, Status> {
    let Some((prefix, data)) = buffer.split_first_chunk::<8>() else {
        // Empty (no values), or too short to be a compressed buffer: arrow-ipc refuses it.
        return Ok(buffer.len());
    };
    let declared = match i64::from_le_bytes(*prefix) {
        -1 => return Ok(data.len()),
        n => usize::try_from(n).map_err(|_| malformed(format!("a buffer of {n} bytes")))?,
    };
    if declared > MAX_BATCH_BYTES {
        return Err(invalid(format!(
            "a buffer of {declared} bytes (decompressed); at most {MAX_BATCH_BYTES} are allowed \
             per batch: send smaller batches"
        )));
    }
    if codec == CompressionType::LZ4_FRAME {
        let mut frame = lz4_flex::frame::FrameDecoder::new(data).take(declared as u64 + 1);
        let held = std::io::copy(&mut frame, &mut std::io::sink())
            .map_err(|e| malformed(format!("an unreadable LZ4 frame: {e}")))?;
        if held != declared as u64 {
            return Err(malformed(format!(
                "an LZ4 frame declares {declared} bytes but holds {}",
                match held > declared as u64 {
                    true => "more".to_string(),
                    false => held.to_string(),
                }
            )));
        }
    }
    Ok(declared)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        ArrayRef, BooleanArray, DictionaryArray, Int32Array, Int64Array, ListArray, NullArray,
        StringArray, StructArray,
    };
    use arrow::datatypes::{DataType, Field, Int32Type};
    use arrow::ipc::writer::IpcWriteOptions;
    use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
    use futures::executor::block_on;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// A batch of the kinds of arrays whose buffers arrow-ipc lays out differently.
    fn batch() -> RecordBatch {
        let rows = 300;
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
        let flags: ArrayRef = Arc::new(BooleanArray::from_iter(
            (0..rows).map(|i| (i % 3 != 1).then_some(i % 2 == 0)),
        ));
        let names: ArrayRef = Arc::new(StringArray::from_iter(
            (0..rows).map(|i| (i % 5 != 0).then(|| format!("name {i}"))),
        ));
        let kinds: ArrayRef = Arc::new(
            (0..rows)
                .map(|i| ["a", "b", "c"][i as usize % 3])
                .collect::<DictionaryArray<Int32Type>>(),
        );
        let lists: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(
            (0..rows).map(|i| (i % 7 != 0).then(|| vec![Some(i as i32), None])),
        ));
        let pairs: ArrayRef = Arc::new(StructArray::from(vec![(
            Arc::new(Field::new("n", DataType::Int32, true)),
            Arc::new(Int32Array::from_iter((0..rows).map(|i| Some(i as i32)))) as ArrayRef,
        )]));
        let nothing: ArrayRef = Arc::new(NullArray::new(rows as usize));
        RecordBatch::try_from_iter([
            ("id", ids),
            ("flag", flags),
            ("name", names),
            ("kind", kinds),
            ("list", lists),
            ("pair", pairs),
            ("nothing", nothing),
        ])
        .unwrap()
    }

    /// The messages of `batches` as a client sends them: schema, dictionaries, batches.
    fn encode(batches: Vec<RecordBatch>, compression: Option<CompressionType>) -> Vec<FlightData> {
        let options = IpcWriteOptions::default()
            .try_with_compression(compression)
            .unwrap();
        let stream = FlightDataEncoderBuilder::new()
            .with_options(options)
            .with_dictionary_handling(DictionaryHandling::Resend)
            .build(futures::stream::iter(batches.into_iter().map(Ok)));
        block_on(stream.try_collect()).unwrap()
    }

    fn decode(messages: Vec<FlightData>) -> Result<Vec<RecordBatch>, Status> {
        block_on(Upload::of_messages(messages).try_collect())
    }

    fn error(messages: Vec<FlightData>) -> String {
        match decode(messages) {
            Ok(batches) => panic!("decoded {} batches of malformed data", batches.len()),
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
                status.message().to_string()
            }
        }
    }

    /// The index of the (last) record batch message.
    fn last_batch(messages: &[FlightData]) -> usize {
        messages
            .iter()
            .rposition(|m| {
                root_as_message(&m.data_header).unwrap().header_type() == MessageHeader::RecordBatch
            })
            .unwrap()
    }

    /// Overwrites entry `i` of a record batch header's buffers (`nodes`: of its field nodes) —
    /// both are vectors of two i64 — with `values`.
    fn rewrite(data: &mut FlightData, nodes: bool, i: usize, values: [i64; 2]) {
        let mut header = data.data_header.to_vec();
        let at = {
            let message = root_as_message(&header).unwrap();
            let batch = message.header_as_record_batch().unwrap();
            let entries = match nodes {
                true => batch.nodes().unwrap().bytes(),
                false => batch.buffers().unwrap().bytes(),
            };
            entries.as_ptr() as usize - header.as_ptr() as usize + i * 16
        };
        header[at..at + 8].copy_from_slice(&values[0].to_le_bytes());
        header[at + 8..at + 16].copy_from_slice(&values[1].to_le_bytes());
        data.data_header = header.into();
    }

    fn buffer(data: &FlightData, i: usize) -> (i64, i64) {
        let message = root_as_message(&data.data_header).unwrap();
        let b = message
            .header_as_record_batch()
            .unwrap()
            .buffers()
            .unwrap()
            .get(i);
        (b.offset(), b.length())
    }

    #[test]
    fn valid_uploads_decode_as_sent() {
        for compression in [
            None,
            Some(CompressionType::LZ4_FRAME),
            Some(CompressionType::ZSTD),
        ] {
            let sent = vec![batch(), batch().slice(10, 50)];
            let got = decode(encode(sent.clone(), compression)).unwrap();
            assert_eq!(got, sent, "{compression:?}");
        }
    }

    #[test]
    fn buffers_outside_the_body_are_refused() {
        let mut messages = encode(vec![batch()], None);
        let at = last_batch(&messages);
        let body = messages[at].data_body.len() as i64;
        for (offset, length) in [(body - 4, 100), (-8, 16), (0, -1), (i64::MAX, 1)] {
            let mut bad = messages.clone();
            rewrite(&mut bad[at], false, 1, [offset, length]);
            let e = error(bad);
            assert!(e.contains("lies outside the message body"), "{e}");
        }
        // The same with the body cut short.
        let cut = messages[at].data_body.slice(..body as usize / 2);
        messages[at].data_body = cut;
        assert!(error(messages).contains("lies outside the message body"));
    }

    #[test]
    fn a_validity_bitmap_shorter_than_its_array_is_an_error() {
        // arrow-buffer's BooleanBuffer::new asserts the bitmap's length: caught, not a crash.
        let mut messages = encode(vec![batch()], None);
        let at = last_batch(&messages);
        // Buffers: id (validity, values), flag (validity, values), ...
        let (offset, length) = buffer(&messages[at], 2);
        assert!(length >= 38, "flag's validity bitmap: {length} bytes");
        rewrite(&mut messages[at], false, 2, [offset, 1]);
        let e = error(messages);
        assert!(e.starts_with("malformed Arrow data: "), "{e}");
        assert!(!e.contains("panicked"), "{e}");
    }

    #[test]
    fn bad_field_nodes_are_refused() {
        let messages = encode(vec![batch()], None);
        let at = last_batch(&messages);
        for (node, expected) in [
            ([300, 301], "with 301 nulls"),
            ([-1, 0], "of -1 rows"),
            ([1 << 40, 0], "at most 16777216 are allowed per batch"),
        ] {
            let mut bad = messages.clone();
            rewrite(&mut bad[at], true, 1, node);
            let e = error(bad);
            assert!(e.contains(expected), "{e}");
        }
    }

    #[test]
    fn compressed_buffers_are_held_to_what_they_declare() {
        let prefix_of_values = |messages: &[FlightData]| {
            let at = last_batch(messages);
            (at, buffer(&messages[at], 1).0 as usize)
        };
        for codec in [CompressionType::LZ4_FRAME, CompressionType::ZSTD] {
            // A buffer declaring more than a batch may hold is refused before it is inflated.
            let mut messages = encode(vec![batch()], Some(codec));
            let (at, start) = prefix_of_values(&messages);
            let mut body = messages[at].data_body.to_vec();
            body[start..start + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
            messages[at].data_body = body.into();
            let e = error(messages);
            assert!(e.contains("at most 268435456 are allowed per batch"), "{e}");
        }
        // An LZ4 frame holding more than it declares (arrow-ipc would read it to its end).
        let mut messages = encode(vec![batch()], Some(CompressionType::LZ4_FRAME));
        let (at, start) = prefix_of_values(&messages);
        let mut body = messages[at].data_body.to_vec();
        body[start..start + 8].copy_from_slice(&16i64.to_le_bytes());
        messages[at].data_body = body.into();
        let e = error(messages);
        assert!(e.contains("declares 16 bytes but holds more"), "{e}");
    }

    #[test]
    fn messages_out_of_order_or_unreadable_are_refused() {
        let messages = encode(vec![batch()], None);
        let at = last_batch(&messages);
        // A dictionary, or a batch, before any schema.
        assert!(error(messages[1..].to_vec()).contains("prior to Schema"));
        assert!(error(messages[at..].to_vec()).contains("prior to Schema"));
        // Two schemas.
        let mut twice = messages.clone();
        twice.insert(1, messages[0].clone());
        assert!(error(twice).contains("multiple Schema"));
        // A header that is not a flatbuffer message.
        let mut garbage = messages.clone();
        garbage[at].data_header = vec![0xab; 40].into();
        assert!(error(garbage).contains("unreadable message header"));
    }

    /// A schema message with one field of type `Int` of `bit_width` bits, or a `List` without
    /// its child.
    fn schema_message(int_bit_width: Option<i32>) -> FlightData {
        use arrow::ipc::{
            FieldBuilder, IntBuilder, ListBuilder, MessageBuilder, MetadataVersion, SchemaBuilder,
            Type,
        };
        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let name = fbb.create_string("x");
        let (kind, type_) = match int_bit_width {
            Some(bits) => {
                let mut int = IntBuilder::new(&mut fbb);
                int.add_bitWidth(bits);
                int.add_is_signed(true);
                (Type::Int, int.finish().as_union_value())
            }
            None => (
                Type::List,
                ListBuilder::new(&mut fbb).finish().as_union_value(),
            ),
        };
        let mut field = FieldBuilder::new(&mut fbb);
        field.add_name(name);
        field.add_nullable(true);
        field.add_type_type(kind);
        field.add_type_(type_);
        let field = field.finish();
        let fields = fbb.create_vector(&[field]);
        let mut schema = SchemaBuilder::new(&mut fbb);
        schema.add_fields(fields);
        let schema = schema.finish();
        let mut message = MessageBuilder::new(&mut fbb);
        message.add_version(MetadataVersion::V5);
        message.add_header_type(MessageHeader::Schema);
        message.add_header(schema.as_union_value());
        let message = message.finish();
        fbb.finish(message, None);
        FlightData {
            data_header: fbb.finished_data().to_vec().into(),
            ..Default::default()
        }
    }

    #[test]
    fn schemas_arrow_ipc_cannot_convert_are_errors() {
        // arrow-ipc's convert.rs panics on both.
        let e = error(vec![schema_message(Some(7))]);
        assert!(e.starts_with("malformed Arrow data: "), "{e}");
        let e = error(vec![schema_message(None)]);
        assert!(e.starts_with("malformed Arrow data: "), "{e}");
        // The same built right is read.
        let upload = block_on(async {
            let mut upload = Upload::of_messages(vec![schema_message(Some(32))]);
            assert!(upload.try_next().await.unwrap().is_none());
            upload
        });
        assert_eq!(
            upload.schema().unwrap().field(0).data_type(),
            &DataType::Int32
        );
    }

    /// Random bytes of random messages changed, many times over: every upload ends, with
    /// batches or an error, and nothing escapes (a panic, an allocation of what a corrupted
    /// size claims). `NYALA_UPLOAD_FUZZ_ITERS` runs longer.
    #[test]
    fn randomly_corrupted_uploads_end_in_batches_or_an_error() {
        let iterations = std::env::var("NYALA_UPLOAD_FUZZ_ITERS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1500);
        let streams = [
            encode(vec![batch(), batch().slice(3, 20)], None),
            encode(vec![batch()], Some(CompressionType::LZ4_FRAME)),
            encode(vec![batch()], Some(CompressionType::ZSTD)),
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut refused, mut caught) = (0, 0);
        for _ in 0..iterations {
            let mut messages = streams[rng.random_range(0..streams.len())].clone();
            for _ in 0..rng.random_range(1..4) {
                let m = rng.random_range(0..messages.len());
                let in_header = messages[m].data_body.is_empty() || rng.random_bool(0.7);
                let mut bytes = match in_header {
                    true => messages[m].data_header.to_vec(),
                    false => messages[m].data_body.to_vec(),
                };
                let i = rng.random_range(0..bytes.len());
                bytes[i] = match rng.random_range(0..4) {
                    0 => 0xff,
                    1 => 0,
                    2 => bytes[i] ^ (1 << rng.random_range(0..8)),
                    _ => rng.random(),
                };
                match in_header {
                    true => messages[m].data_header = bytes.into(),
                    false => messages[m].data_body = bytes.into(),
                }
            }
            if let Err(status) = decode(messages) {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
                refused += 1;
                caught += status.message().starts_with("malformed Arrow data: ") as usize;
            }
        }
        assert!(
            refused > iterations / 4,
            "{refused} of {iterations} refused"
        );
        eprintln!("{refused} of {iterations} corrupted uploads refused, {caught} as malformed");
    }
}
