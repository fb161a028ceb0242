package dev.nyala;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.Date;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Timestamp;
import java.sql.Types;
import java.time.Instant;
import java.time.LocalDate;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The Apache Arrow Flight SQL JDBC driver against a real {@code nyala serve} process.
 *
 * <p>The server is a {@link NyalaServerProcess} (which says where the binary comes from). Each
 * test uses its own tables, so the tests share one server and one connection (the session test
 * opens a second one). The server's stderr goes to target/nyala-server.log.
 */
class NyalaJdbcTest {
  private static NyalaServerProcess server;
  private static String url;
  private static Connection conn;

  @BeforeAll
  static void startServer() throws Exception {
    server = NyalaServerProcess.start("nyala-server.log");
    assertEquals("grpc", server.scheme, "the server must serve plaintext gRPC");
    url = "jdbc:arrow-flight-sql://" + server.host + ":" + server.port + "/?useEncryption=false";
    conn = DriverManager.getConnection(url);
  }

  @AfterAll
  static void stopServer() throws Exception {
    if (conn != null) {
      try {
        conn.close();
      } catch (SQLException ignored) {
        // The server may already be gone; it is about to be anyway.
      }
      conn = null;
    }
    if (server != null) {
      server.close();
      server = null;
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 1. Plain statements: DDL, DML update counts, typed results, aggregates.

  @Test
  void statementRoundTrip() throws SQLException {
    try (Statement st = conn.createStatement()) {
      assertEquals(
          0,
          st.executeUpdate(
              "CREATE TABLE stmt_t (id BIGINT NOT NULL, name STRING, score DOUBLE, PRIMARY KEY (id)) "
                  + "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS"),
          "CREATE TABLE update count");
      assertEquals(
          3,
          st.executeUpdate("INSERT INTO stmt_t VALUES (1, 'alpha', 1.5), (2, 'beta', 2.5), (3, NULL, NULL)"));
      assertEquals(1, st.executeUpdate("INSERT INTO stmt_t VALUES (4, 'delta', 4.25)"));

      try (ResultSet rs = st.executeQuery("SELECT id, name, score FROM stmt_t ORDER BY id")) {
        ResultSetMetaData md = rs.getMetaData();
        assertEquals(3, md.getColumnCount());
        assertEquals(List.of("id", "name", "score"), List.of(md.getColumnName(1), md.getColumnName(2), md.getColumnName(3)));
        assertEquals(Types.BIGINT, md.getColumnType(1));
        assertEquals(Types.VARCHAR, md.getColumnType(2));
        assertEquals(Types.DOUBLE, md.getColumnType(3));

        assertTrue(rs.next());
        assertEquals(1L, rs.getLong("id"));
        assertEquals("alpha", rs.getString("name"));
        assertEquals(1.5, rs.getDouble("score"));
        assertTrue(rs.next());
        assertEquals(2L, rs.getLong(1));
        assertEquals("beta", rs.getString(2));
        assertEquals(2.5, rs.getDouble(3));
        assertTrue(rs.next());
        assertEquals(3L, rs.getLong(1));
        assertNull(rs.getString(2));
        assertTrue(rs.wasNull());
        assertEquals(0.0, rs.getDouble(3));
        assertTrue(rs.wasNull());
        assertTrue(rs.next());
        assertEquals(4L, rs.getLong(1));
        assertEquals("delta", rs.getString(2));
        assertEquals(4.25, rs.getDouble(3));
        assertFalse(rs.next());
      }

      assertEquals(2, st.executeUpdate("UPDATE stmt_t SET score = score * 2 WHERE id <= 2"));
      assertEquals(1, st.executeUpdate("DELETE FROM stmt_t WHERE id = 4"));
      assertEquals(1, st.executeUpdate("UPSERT INTO stmt_t VALUES (3, 'gamma', 3.0)"));

      // execute() tells queries from updates.
      assertFalse(st.execute("UPDATE stmt_t SET name = 'ALPHA' WHERE id = 1"));
      assertEquals(1, st.getUpdateCount());
      assertTrue(st.execute("SELECT name FROM stmt_t WHERE id = 1"));
      try (ResultSet rs = st.getResultSet()) {
        assertTrue(rs.next());
        assertEquals("ALPHA", rs.getString(1));
        assertFalse(rs.next());
      }

      try (ResultSet rs =
          st.executeQuery(
              "SELECT count(*) AS n, sum(score) AS total, min(name) AS first, max(id) AS top FROM stmt_t")) {
        assertTrue(rs.next());
        assertEquals(3L, rs.getLong("n"));
        assertEquals(3.0 + 5.0 + 3.0, rs.getDouble("total"), 1e-9);
        assertEquals("ALPHA", rs.getString("first"));
        assertEquals(3L, rs.getLong("top"));
        assertFalse(rs.next());
      }

      try (ResultSet rs =
          st.executeQuery(
              "SELECT score > 3 AS big, count(*) AS n FROM stmt_t GROUP BY score > 3 ORDER BY big")) {
        assertTrue(rs.next());
        assertFalse(rs.getBoolean("big"));
        assertEquals(2L, rs.getLong("n")); // ids 1 (3.0) and 3 (3.0)
        assertTrue(rs.next());
        assertTrue(rs.getBoolean("big"));
        assertEquals(1L, rs.getLong("n")); // id 2 (5.0)
        assertFalse(rs.next());
      }
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 2. DatabaseMetaData: catalogs, schemas, tables, columns, primary keys.

  @Test
  void databaseMetaData() throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.executeUpdate(
          "CREATE TABLE meta_t (id BIGINT NOT NULL, name STRING, score DOUBLE, PRIMARY KEY (id)) "
              + "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS");
      st.executeUpdate(
          "CREATE TABLE meta_keys (host STRING, ts TIMESTAMP, metric STRING, value DOUBLE, "
              + "PRIMARY KEY (host, metric, ts)) DISTRIBUTE BY HASH (host, metric) INTO 2 BUCKETS");
      st.executeUpdate(
          "CREATE TABLE meta_types (k BIGINT NOT NULL, ti TINYINT, si SMALLINT, i INT, f FLOAT, "
              + "d DOUBLE, b BOOLEAN, s STRING, v VARCHAR, bin BINARY, ts TIMESTAMP, dt DATE, PRIMARY KEY (k))");
    }
    DatabaseMetaData md = conn.getMetaData();

    assertTrue(column(md.getCatalogs(), "TABLE_CAT").contains("nyala"), "getCatalogs has nyala");

    List<List<String>> schemas = rows(md.getSchemas(), "TABLE_CATALOG", "TABLE_SCHEM");
    assertTrue(schemas.contains(List.of("nyala", "public")), "getSchemas has nyala.public: " + schemas);
    assertEquals(
        List.of("public"), column(md.getSchemas("nyala", "pub%"), "TABLE_SCHEM"), "getSchemas(nyala, pub%)");

    assertTrue(column(md.getTableTypes(), "TABLE_TYPE").contains("TABLE"), "getTableTypes has TABLE");

    assertEquals(
        List.of(List.of("nyala", "public", "meta_t", "TABLE")),
        rows(md.getTables(null, null, "meta_t", null), "TABLE_CAT", "TABLE_SCHEM", "TABLE_NAME", "TABLE_TYPE"),
        "getTables(meta_t)");
    List<String> metaTables = column(md.getTables("nyala", "public", "meta%", new String[] {"TABLE"}), "TABLE_NAME");
    assertTrue(
        metaTables.containsAll(List.of("meta_t", "meta_keys", "meta_types")),
        "getTables(meta%) lists the three tables: " + metaTables);
    assertEquals(List.of(), column(md.getTables(null, null, "meta_t", new String[] {"VIEW"}), "TABLE_NAME"), "no views");
    assertEquals(List.of(), column(md.getTables(null, null, "no_such_table", null), "TABLE_NAME"));

    // getColumns: in table order, with the driver's type mapping of the Arrow schema.
    List<List<String>> cols =
        rows(
            md.getColumns(null, null, "meta_t", null),
            "TABLE_CAT",
            "TABLE_SCHEM",
            "TABLE_NAME",
            "COLUMN_NAME",
            "ORDINAL_POSITION",
            "DATA_TYPE",
            "TYPE_NAME",
            "NULLABLE",
            "IS_NULLABLE");
    assertEquals(
        List.of(
            List.of("nyala", "public", "meta_t", "id", "1", "" + Types.BIGINT, "BIGINT", "" + DatabaseMetaData.columnNoNulls, "NO"),
            List.of("nyala", "public", "meta_t", "name", "2", "" + Types.VARCHAR, "VARCHAR", "" + DatabaseMetaData.columnNullable, "YES"),
            List.of("nyala", "public", "meta_t", "score", "3", "" + Types.DOUBLE, "DOUBLE", "" + DatabaseMetaData.columnNullable, "YES")),
        cols,
        "getColumns(meta_t)");
    assertEquals(List.of("score"), column(md.getColumns("nyala", "public", "meta_t", "sc%"), "COLUMN_NAME"));

    Map<String, Integer> types = new LinkedHashMap<>();
    try (ResultSet rs = md.getColumns(null, null, "meta_types", null)) {
      while (rs.next()) {
        types.put(rs.getString("COLUMN_NAME"), rs.getInt("DATA_TYPE"));
      }
    }
    Map<String, Integer> expected = new LinkedHashMap<>();
    expected.put("k", Types.BIGINT);
    expected.put("ti", Types.TINYINT);
    expected.put("si", Types.SMALLINT);
    expected.put("i", Types.INTEGER);
    expected.put("f", Types.FLOAT); // the driver's name for Arrow's single-precision float
    expected.put("d", Types.DOUBLE);
    expected.put("b", Types.BOOLEAN);
    expected.put("s", Types.VARCHAR);
    expected.put("v", Types.VARCHAR);
    expected.put("bin", Types.VARBINARY);
    expected.put("ts", Types.TIMESTAMP_WITH_TIMEZONE); // Timestamp(µs, "UTC")
    expected.put("dt", Types.DATE);
    assertEquals(expected, types, "getColumns(meta_types) DATA_TYPE");

    // getPrimaryKeys: the key columns with their position in the key (not in the table).
    assertEquals(
        List.of(List.of("nyala", "public", "meta_t", "id", "1")),
        rows(md.getPrimaryKeys(null, null, "meta_t"), "TABLE_CAT", "TABLE_SCHEM", "TABLE_NAME", "COLUMN_NAME", "KEY_SEQ"));
    Map<String, Integer> keySeq = new LinkedHashMap<>();
    try (ResultSet rs = md.getPrimaryKeys("nyala", "public", "meta_keys")) {
      while (rs.next()) {
        assertEquals("meta_keys", rs.getString("TABLE_NAME"));
        keySeq.put(rs.getString("COLUMN_NAME"), rs.getInt("KEY_SEQ"));
      }
    }
    assertEquals(Map.of("host", 1, "metric", 2, "ts", 3), keySeq, "getPrimaryKeys(meta_keys)");
  }

  // ---------------------------------------------------------------------------------------------
  // 3. PreparedStatement with `?` parameters: queries, batched inserts, updates.

  @Test
  void preparedStatementParameters() throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.executeUpdate(
          "CREATE TABLE prep_t (id BIGINT NOT NULL, name STRING, score DOUBLE, PRIMARY KEY (id)) "
              + "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS");
    }

    try (PreparedStatement ins = conn.prepareStatement("INSERT INTO prep_t VALUES (?, ?, ?)")) {
      assertEquals(3, ins.getParameterMetaData().getParameterCount(), "INSERT parameter count");
      ins.setLong(1, 1);
      ins.setString(2, "one");
      ins.setDouble(3, 1.5);
      ins.addBatch();
      ins.setLong(1, 2);
      ins.setString(2, "two");
      ins.setDouble(3, 2.5);
      ins.addBatch();
      ins.setLong(1, 3);
      ins.setNull(2, Types.VARCHAR);
      ins.setDouble(3, 3.5);
      ins.addBatch();
      int[] counts = ins.executeBatch();
      // The driver sends the whole batch as one parameter set and reports the total in one count.
      assertEquals(3, Arrays.stream(counts).sum(), "executeBatch counts " + Arrays.toString(counts));

      ins.setLong(1, 4);
      ins.setString(2, "four");
      ins.setDouble(3, 4.5);
      assertEquals(1, ins.executeUpdate(), "single parameterised INSERT");
    }

    try (Statement st = conn.createStatement();
        ResultSet rs = st.executeQuery("SELECT id, name, score FROM prep_t ORDER BY id")) {
      Object[][] expected = {{1L, "one", 1.5}, {2L, "two", 2.5}, {3L, null, 3.5}, {4L, "four", 4.5}};
      for (Object[] row : expected) {
        assertTrue(rs.next());
        assertArrayEquals(row, new Object[] {rs.getLong(1), rs.getString(2), rs.getDouble(3)});
      }
      assertFalse(rs.next());
    }

    try (PreparedStatement sel = conn.prepareStatement("SELECT name, score FROM prep_t WHERE id = ?")) {
      assertEquals(1, sel.getParameterMetaData().getParameterCount());
      sel.setLong(1, 2);
      try (ResultSet rs = sel.executeQuery()) {
        assertTrue(rs.next());
        assertEquals("two", rs.getString("name"));
        assertEquals(2.5, rs.getDouble("score"));
        assertFalse(rs.next());
      }
      // The same statement again with another value.
      sel.setLong(1, 4);
      try (ResultSet rs = sel.executeQuery()) {
        assertTrue(rs.next());
        assertEquals("four", rs.getString("name"));
        assertFalse(rs.next());
      }
      sel.setLong(1, 99);
      try (ResultSet rs = sel.executeQuery()) {
        assertFalse(rs.next(), "no row with id 99");
      }
    }

    try (PreparedStatement cnt = conn.prepareStatement("SELECT count(*) FROM prep_t WHERE score > ? AND name IS NOT NULL")) {
      cnt.setDouble(1, 2.0);
      try (ResultSet rs = cnt.executeQuery()) {
        assertTrue(rs.next());
        assertEquals(2L, rs.getLong(1)); // ids 2 and 4
      }
    }

    try (PreparedStatement upd = conn.prepareStatement("UPDATE prep_t SET name = ? WHERE id = ?")) {
      upd.setString(1, "THREE");
      upd.setLong(2, 3);
      assertEquals(1, upd.executeUpdate());
      upd.setString(1, "nobody");
      upd.setLong(2, 99);
      assertEquals(0, upd.executeUpdate());
    }
    try (PreparedStatement del = conn.prepareStatement("DELETE FROM prep_t WHERE score < ?")) {
      del.setDouble(1, 2.0);
      assertEquals(1, del.executeUpdate()); // id 1
    }

    try (Statement st = conn.createStatement();
        ResultSet rs = st.executeQuery("SELECT id, name FROM prep_t ORDER BY id")) {
      List<List<Object>> got = new ArrayList<>();
      while (rs.next()) {
        got.add(List.of(rs.getLong(1), rs.getString(2)));
      }
      assertEquals(List.of(List.of(2L, "two"), List.of(3L, "THREE"), List.of(4L, "four")), got);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 4. Errors reach the client as SQLExceptions and leave the table as it was.

  @Test
  void errorsLeaveTableUnchanged() throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.executeUpdate(
          "CREATE TABLE err_t (id BIGINT NOT NULL, name STRING, score DOUBLE, PRIMARY KEY (id)) "
              + "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS");
      st.executeUpdate("INSERT INTO err_t VALUES (1, 'a', 1.0), (2, 'b', 2.0)");

      SQLException syntax = assertThrows(SQLException.class, () -> st.executeQuery("SELEC id FROM err_t"));
      assertMessageContains(syntax, "syntax error");
      assertMessageContains(syntax, "SELEC");

      SQLException syntaxUpdate =
          assertThrows(SQLException.class, () -> st.executeUpdate("INSERT INTO err_t VALUES (3, 'c'"));
      assertMessageContains(syntaxUpdate, "syntax error");

      SQLException unknownTable = assertThrows(SQLException.class, () -> st.executeQuery("SELECT * FROM no_such_table"));
      assertMessageContains(unknownTable, "no_such_table");

      SQLException duplicate =
          assertThrows(SQLException.class, () -> st.executeUpdate("INSERT INTO err_t VALUES (1, 'dup', 9.0)"));
      assertMessageContains(duplicate, "duplicate primary key");
      assertMessageContains(duplicate, "id=1");

      SQLException duplicateStmt =
          assertThrows(SQLException.class, () -> st.execute("INSERT INTO err_t VALUES (2, 'dup', 9.0)"));
      assertMessageContains(duplicateStmt, "duplicate primary key");
    }

    // The driver wraps errors raised while preparing as "while preparing SQL: ..."; the server's
    // message is the cause.
    SQLException preparedSyntax = assertThrows(SQLException.class, () -> conn.prepareStatement("SELEC id FROM err_t"));
    assertCauseChainContains(preparedSyntax, "syntax error");

    try (PreparedStatement ins = conn.prepareStatement("INSERT INTO err_t VALUES (?, ?, ?)")) {
      ins.setLong(1, 2);
      ins.setString(2, "dup");
      ins.setDouble(3, 9.0);
      SQLException duplicate = assertThrows(SQLException.class, ins::executeUpdate);
      assertMessageContains(duplicate, "duplicate primary key");
    }

    // The table is as it was, and the connection still works.
    try (Statement st = conn.createStatement();
        ResultSet rs = st.executeQuery("SELECT id, name, score FROM err_t ORDER BY id")) {
      List<List<Object>> got = new ArrayList<>();
      while (rs.next()) {
        got.add(List.of(rs.getLong(1), rs.getString(2), rs.getDouble(3)));
      }
      assertEquals(List.of(List.of(1L, "a", 1.0), List.of(2L, "b", 2.0)), got);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 5. DDL through PreparedStatement (the driver prepares every statement anyway).

  @Test
  void ddlThroughPreparedStatement() throws SQLException {
    DatabaseMetaData md = conn.getMetaData();
    String create =
        "CREATE TABLE ddl_t (id BIGINT NOT NULL, name STRING, score DOUBLE, PRIMARY KEY (id)) "
            + "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS";
    try (PreparedStatement ps = conn.prepareStatement(create)) {
      assertEquals(0, ps.getMetaData().getColumnCount(), "CREATE TABLE has no result columns");
      assertNoResultSet(ps, "CREATE TABLE");
    }
    assertEquals(List.of("ddl_t"), column(md.getTables(null, null, "ddl_t", null), "TABLE_NAME"));

    // A second CREATE fails with the server's message. Driver 18.3.0 lets the Flight error of a
    // prepared statement's execute() escape unwrapped (a RuntimeException, not an SQLException).
    Exception exists =
        assertThrows(
            Exception.class,
            () -> {
              try (PreparedStatement ps = conn.prepareStatement(create)) {
                ps.execute();
              }
            },
            "CREATE TABLE of an existing table");
    assertCauseChainContains(exists, "table 'ddl_t' already exists");
    try (PreparedStatement ps = conn.prepareStatement(create.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))) {
      assertNoResultSet(ps, "CREATE TABLE IF NOT EXISTS");
    }

    try (PreparedStatement ps = conn.prepareStatement("INSERT INTO ddl_t VALUES (1, 'x', 1.0)")) {
      assertEquals(1, ps.executeUpdate());
    }
    try (Statement st = conn.createStatement();
        ResultSet rs = st.executeQuery("SELECT count(*) FROM ddl_t")) {
      assertTrue(rs.next());
      assertEquals(1L, rs.getLong(1));
    }

    PreparedStatement drop = conn.prepareStatement("DROP TABLE ddl_t");
    assertEquals(List.of("ddl_t"), column(md.getTables(null, null, "ddl_t", null), "TABLE_NAME"), "prepare does not drop");
    try (drop) {
      assertNoResultSet(drop, "DROP TABLE");
    }
    assertEquals(List.of(), column(md.getTables(null, null, "ddl_t", null), "TABLE_NAME"));
    try (Statement st = conn.createStatement()) {
      SQLException gone = assertThrows(SQLException.class, () -> st.executeQuery("SELECT * FROM ddl_t"));
      assertMessageContains(gone, "ddl_t");
    }
    try (PreparedStatement ps = conn.prepareStatement("DROP TABLE IF EXISTS ddl_t")) {
      assertNoResultSet(ps, "DROP TABLE IF EXISTS");
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 6. Every column type, written as SQL literals and as parameters, read back with JDBC getters.

  @Test
  void allColumnTypesRoundTrip() throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.executeUpdate(
          "CREATE TABLE types_t (k BIGINT NOT NULL, ti TINYINT, si SMALLINT, i INT, f FLOAT, d DOUBLE, "
              + "b BOOLEAN, s STRING, bin BINARY, ts TIMESTAMP, dt DATE, PRIMARY KEY (k))");
      assertEquals(
          1,
          st.executeUpdate(
              "INSERT INTO types_t VALUES (1, -8, -16, -32, 0.5, -2.25, true, 'héllo', X'00ff10', "
                  + "'2026-01-02T03:04:05.123456', '2026-01-02')"));
      assertEquals(
          1, st.executeUpdate("INSERT INTO types_t (k) VALUES (3)"), "a row of NULLs besides the key");
    }

    try (PreparedStatement ps = conn.prepareStatement("INSERT INTO types_t VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")) {
      ps.setLong(1, 2);
      ps.setByte(2, (byte) -8);
      ps.setShort(3, (short) -16);
      ps.setInt(4, -32);
      ps.setFloat(5, 0.5f);
      ps.setDouble(6, -2.25);
      ps.setBoolean(7, true);
      ps.setString(8, "héllo");
      ps.setBytes(9, new byte[] {0, (byte) 0xff, 0x10});
      ps.setTimestamp(10, Timestamp.from(Instant.parse("2026-01-02T03:04:05.123456Z")));
      ps.setDate(11, Date.valueOf(LocalDate.of(2026, 1, 2)));
      assertEquals(1, ps.executeUpdate());
    }

    try (Statement st = conn.createStatement();
        ResultSet rs = st.executeQuery("SELECT * FROM types_t ORDER BY k")) {
      for (long k = 1; k <= 2; k++) {
        assertTrue(rs.next());
        String row = "row k=" + k;
        assertEquals(k, rs.getLong("k"), row);
        assertEquals((byte) -8, rs.getByte("ti"), row);
        assertEquals((short) -16, rs.getShort("si"), row);
        assertEquals(-32, rs.getInt("i"), row);
        assertEquals(0.5f, rs.getFloat("f"), row);
        assertEquals(-2.25, rs.getDouble("d"), row);
        assertTrue(rs.getBoolean("b"), row);
        assertEquals("héllo", rs.getString("s"), row);
        assertArrayEquals(new byte[] {0, (byte) 0xff, 0x10}, rs.getBytes("bin"), row);
        Timestamp ts = rs.getTimestamp("ts");
        assertNotNull(ts, row);
        // surefire runs with -Duser.timezone=UTC, so the driver's local-time view is UTC too.
        // A literal keeps microseconds; setTimestamp carries milliseconds only (Avatica passes
        // epoch millis, apache/arrow-java#838).
        String expected = k == 1 ? "2026-01-02T03:04:05.123456Z" : "2026-01-02T03:04:05.123Z";
        assertEquals(Instant.parse(expected), ts.toInstant(), row);
        assertEquals(LocalDate.of(2026, 1, 2), rs.getDate("dt").toLocalDate(), row);
      }
      assertTrue(rs.next());
      assertEquals(3L, rs.getLong("k"));
      for (String c : List.of("ti", "si", "i", "f", "d", "b", "s", "bin", "ts", "dt")) {
        assertNull(rs.getObject(c), "NULL " + c);
      }
      assertFalse(rs.next());
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 7. Every kind of statement through Statement.execute(): a result set when it returns true
  //    (read to the end), else an update count. The result's schema must be the one the server
  //    announced, or the driver fails the statement.

  @Test
  void everyStatementKindThroughExecute() throws SQLException {
    try (Statement st = conn.createStatement()) {
      assertNoRows(st, "CREATE TABLE kinds_t (id BIGINT NOT NULL, name STRING, PRIMARY KEY (id)) "
          + "DISTRIBUTE BY HASH (id) INTO 2 BUCKETS");
      assertCount(st, 3, "INSERT INTO kinds_t VALUES (1, 'a'), (2, 'b'), (3, 'c')");
      assertCount(st, 2, "UPDATE kinds_t SET name = 'z' WHERE id <= 2");
      assertCount(st, 1, "DELETE FROM kinds_t WHERE id = 1");
      assertCount(st, 2, "UPSERT INTO kinds_t VALUES (1, 'again'), (4, 'd')");
      assertEquals(
          List.of(List.of("1", "again"), List.of("2", "z"), List.of("3", "c"), List.of("4", "d")),
          queryRows(st, "SELECT id, name FROM kinds_t ORDER BY id"));
      assertTrue(queryRows(st, "SHOW TABLES").contains(List.of("kinds_t")), "SHOW TABLES lists kinds_t");
      assertFalse(queryRows(st, "DESCRIBE kinds_t").isEmpty(), "DESCRIBE has rows");
      assertTrue(
          queryRows(st, "SHOW CREATE TABLE kinds_t").toString().contains("kinds_t"),
          "SHOW CREATE TABLE names the table");
      assertFalse(queryRows(st, "SHOW PARTITIONS kinds_t").isEmpty(), "SHOW PARTITIONS has rows");
      assertFalse(queryRows(st, "EXPLAIN SELECT id FROM kinds_t WHERE id > 1").isEmpty(), "EXPLAIN has rows");
      assertNoRows(st, "SET datafusion.execution.batch_size = 4096");
      assertNoRows(st, "ALTER TABLE kinds_t ADD COLUMN score DOUBLE");
      assertNoRows(st, "DROP TABLE kinds_t");
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 8. Each connection is its own session: a SET in one is not seen by another.

  @Test
  void settingsArePerConnection() throws SQLException {
    String show = "SHOW datafusion.execution.batch_size";
    try (Connection other = DriverManager.getConnection(url);
        Statement otherSt = other.createStatement();
        Statement st = conn.createStatement()) {
      // The shared connection's own value (another test may have SET it).
      List<List<String>> before = queryRows(st, show);
      assertEquals(
          List.of(List.of("datafusion.execution.batch_size", "8192")),
          queryRows(otherSt, show),
          "a new connection starts from the default");
      assertNoRows(otherSt, "SET datafusion.execution.batch_size = 1234");
      assertEquals(List.of(List.of("datafusion.execution.batch_size", "1234")), queryRows(otherSt, show));
      assertEquals(before, queryRows(st, show), "the SET of another connection is not seen here");
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 9. Concurrent read-modify-write: no lost update, no spurious 0-row update.

  @Test
  void concurrentIncrementsAreNotLost() throws Exception {
    int clients = 16;
    int increments = 30;
    int keys = 10;
    try (Statement st = conn.createStatement()) {
      assertNoRows(st, "CREATE TABLE incr_t (k BIGINT PRIMARY KEY, v BIGINT) DISTRIBUTE BY HASH (k) INTO 4 BUCKETS");
      assertCount(st, keys, "INSERT INTO incr_t SELECT value, 0 FROM generate_series(0, " + (keys - 1) + ")");
    }
    long[] expected = new long[keys];
    List<String> failures = java.util.Collections.synchronizedList(new ArrayList<>());
    List<Thread> threads = new ArrayList<>();
    for (int c = 0; c < clients; c++) {
      int client = c;
      Thread t =
          new Thread(
              () -> {
                java.util.Random random = new java.util.Random(client);
                try (Connection own = DriverManager.getConnection(url);
                    PreparedStatement ps = own.prepareStatement("UPDATE incr_t SET v = v + 1 WHERE k = ?")) {
                  for (int i = 0; i < increments; i++) {
                    int k = random.nextInt(keys);
                    ps.setLong(1, k);
                    int updated = ps.executeUpdate();
                    if (updated != 1) {
                      failures.add("UPDATE of key " + k + " reported " + updated + " rows");
                    }
                    synchronized (expected) {
                      expected[k] += 1;
                    }
                  }
                } catch (SQLException e) {
                  failures.add(e.toString());
                }
              });
      threads.add(t);
      t.start();
    }
    for (Thread t : threads) {
      t.join();
    }
    assertEquals(List.of(), failures, "every increment succeeds and reports one row");
    List<List<String>> want = new ArrayList<>();
    for (int k = 0; k < keys; k++) {
      want.add(List.of("" + k, "" + expected[k]));
    }
    try (Statement st = conn.createStatement()) {
      assertEquals(want, queryRows(st, "SELECT k, v FROM incr_t ORDER BY k"), "no increment is lost");
      assertNoRows(st, "DROP TABLE incr_t");
    }
  }

  // ---------------------------------------------------------------------------------------------

  private static void assertMessageContains(SQLException e, String needle) {
    StringBuilder all = new StringBuilder();
    for (Throwable t = e; t != null; t = t.getCause()) {
      all.append(t.getMessage()).append('\n');
    }
    // The server's message must be in the SQLException's own message, not only in a cause.
    String message = String.valueOf(e.getMessage());
    assertTrue(
        message.toLowerCase().contains(needle.toLowerCase()),
        "expected '" + needle + "' in the SQLException message; messages along the cause chain:\n" + all);
  }

  private static void assertCauseChainContains(Throwable e, String needle) {
    StringBuilder all = new StringBuilder();
    for (Throwable t = e; t != null; t = t.getCause()) {
      all.append(t.getMessage()).append('\n');
    }
    assertTrue(
        all.toString().toLowerCase().contains(needle.toLowerCase()),
        "expected '" + needle + "' along the cause chain:\n" + all);
  }

  /**
   * Runs a DDL statement with PreparedStatement.execute(). Driver 18.3.0 reports every prepared
   * statement as a query (apache/arrow-java#797, fixed in 19.0.0, which Maven Central does not
   * serve here), so execute() may return true; the result set it then returns must be empty.
   */
  private static void assertNoResultSet(PreparedStatement ps, String what) throws SQLException {
    if (ps.execute()) {
      try (ResultSet rs = ps.getResultSet()) {
        assertFalse(rs.next(), what + " returns no rows");
      }
    }
  }

  /** A statement with no result: an empty result set, or an update count of 0. */
  private static void assertNoRows(Statement st, String sql) throws SQLException {
    if (st.execute(sql)) {
      assertEquals(List.of(), readRows(st.getResultSet()), sql + " returns no rows");
    } else {
      assertEquals(0, st.getUpdateCount(), sql + " update count");
    }
  }

  /** A DML statement: its update count, or a result set with that count as its one row. */
  private static void assertCount(Statement st, long count, String sql) throws SQLException {
    if (st.execute(sql)) {
      assertEquals(List.of(List.of("" + count)), readRows(st.getResultSet()), sql + " count row");
    } else {
      assertEquals(count, st.getUpdateCount(), sql + " update count");
    }
  }

  /** A query through Statement.execute(): every row, each column as a string. */
  private static List<List<String>> queryRows(Statement st, String sql) throws SQLException {
    assertTrue(st.execute(sql), sql + " returns a result set");
    return readRows(st.getResultSet());
  }

  private static List<List<String>> readRows(ResultSet rs) throws SQLException {
    List<List<String>> out = new ArrayList<>();
    try (rs) {
      int columns = rs.getMetaData().getColumnCount();
      while (rs.next()) {
        List<String> row = new ArrayList<>();
        for (int i = 1; i <= columns; i++) {
          row.add(rs.getString(i));
        }
        out.add(row);
      }
    }
    return out;
  }

  private static List<String> column(ResultSet rs, String name) throws SQLException {
    List<String> out = new ArrayList<>();
    try (rs) {
      while (rs.next()) {
        out.add(rs.getString(name));
      }
    }
    return out;
  }

  private static List<List<String>> rows(ResultSet rs, String... names) throws SQLException {
    List<List<String>> out = new ArrayList<>();
    try (rs) {
      while (rs.next()) {
        List<String> row = new ArrayList<>();
        for (String n : names) {
          row.add(rs.getString(n));
        }
        out.add(row);
      }
    }
    return out;
  }
}
