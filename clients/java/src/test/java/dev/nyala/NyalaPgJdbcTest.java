package dev.nyala;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.math.BigDecimal;
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * pgjdbc, PostgreSQL's own JDBC driver, against a real {@code nyala serve} process's PostgreSQL
 * protocol: prepared statements (server-prepared after the driver's threshold), batches,
 * fetch sizes, transactions, SQLSTATEs and DatabaseMetaData. The server's stderr goes to
 * target/nyala-pgjdbc.log.
 */
class NyalaPgJdbcTest {
  private static NyalaServerProcess server;
  private static Connection conn;

  @BeforeAll
  static void startServer() throws Exception {
    server = NyalaServerProcess.start("nyala-pgjdbc.log");
    Properties props = new Properties();
    props.setProperty("user", "nyala");
    // Server-side prepared statements from the first execution.
    props.setProperty("prepareThreshold", "1");
    conn = DriverManager.getConnection(server.postgresUrl(), props);
  }

  @AfterAll
  static void stopServer() throws Exception {
    if (conn != null) {
      conn.close();
    }
    if (server != null) {
      server.close();
    }
  }

  @Test
  void preparedStatementsAndBatches() throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.execute(
          "CREATE TABLE pg_items (id BIGINT PRIMARY KEY, name STRING, price DECIMAL(10, 2)) "
              + "DISTRIBUTE BY HASH (id) INTO 2 BUCKETS");
    }
    try (PreparedStatement insert =
        conn.prepareStatement("INSERT INTO pg_items VALUES (?, ?, ?)")) {
      for (int i = 1; i <= 20; i++) {
        insert.setLong(1, i);
        insert.setString(2, "item " + i);
        insert.setBigDecimal(3, new BigDecimal(i + ".25"));
        insert.addBatch();
      }
      int[] counts = insert.executeBatch();
      assertEquals(20, counts.length);
      for (int count : counts) {
        assertEquals(1, count);
      }
    }
    try (PreparedStatement lookup = conn.prepareStatement("SELECT name, price FROM pg_items WHERE id = ?")) {
      for (int i = 1; i <= 20; i++) {
        lookup.setLong(1, i);
        try (ResultSet rs = lookup.executeQuery()) {
          assertTrue(rs.next());
          assertEquals("item " + i, rs.getString(1));
          assertEquals(new BigDecimal(i + ".25"), rs.getBigDecimal(2));
          assertFalse(rs.next());
        }
      }
    }
    try (PreparedStatement update = conn.prepareStatement("UPDATE pg_items SET price = price * 2 WHERE id <= ?")) {
      update.setLong(1, 5);
      assertEquals(5, update.executeUpdate());
    }
  }

  @Test
  void fetchSizeReadsInPortionsInATransaction() throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.execute("CREATE TABLE pg_many (k INT PRIMARY KEY, v INT)");
      st.execute("INSERT INTO pg_many SELECT value, value * 2 FROM generate_series(1, 1000)");
    }
    conn.setAutoCommit(false);
    try (Statement st = conn.createStatement()) {
      // pgjdbc reads through a portal, 100 rows per Execute, inside a transaction.
      st.setFetchSize(100);
      List<Integer> keys = new ArrayList<>();
      try (ResultSet rs = st.executeQuery("SELECT k FROM pg_many ORDER BY k")) {
        while (rs.next()) {
          keys.add(rs.getInt(1));
        }
      }
      assertEquals(1000, keys.size());
      assertEquals(1000, keys.get(999));
      conn.commit();
    } finally {
      conn.setAutoCommit(true);
    }
  }

  @Test
  void transactionsCommitAndRollBack() throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.execute("CREATE TABLE pg_accounts (id INT PRIMARY KEY, balance BIGINT)");
      st.execute("INSERT INTO pg_accounts VALUES (1, 100), (2, 100)");
    }
    conn.setAutoCommit(false);
    try (Statement st = conn.createStatement()) {
      st.executeUpdate("UPDATE pg_accounts SET balance = balance - 30 WHERE id = 1");
      st.executeUpdate("UPDATE pg_accounts SET balance = balance + 30 WHERE id = 2");
      conn.rollback();
      st.executeUpdate("UPDATE pg_accounts SET balance = balance - 10 WHERE id = 1");
      st.executeUpdate("UPDATE pg_accounts SET balance = balance + 10 WHERE id = 2");
      conn.commit();
    } finally {
      conn.setAutoCommit(true);
    }
    try (Statement st = conn.createStatement();
        ResultSet rs = st.executeQuery("SELECT balance FROM pg_accounts ORDER BY id")) {
      assertTrue(rs.next());
      assertEquals(90, rs.getLong(1));
      assertTrue(rs.next());
      assertEquals(110, rs.getLong(1));
    }
  }

  @Test
  void errorsCarrySqlStates() throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.execute("CREATE TABLE pg_unique (k INT PRIMARY KEY)");
      st.execute("INSERT INTO pg_unique VALUES (1)");
      SQLException duplicate =
          assertThrows(SQLException.class, () -> st.execute("INSERT INTO pg_unique VALUES (1)"));
      assertEquals("23505", duplicate.getSQLState());
      SQLException missing =
          assertThrows(SQLException.class, () -> st.executeQuery("SELECT * FROM pg_nowhere"));
      assertEquals("42P01", missing.getSQLState());
      try (ResultSet rs = st.executeQuery("SELECT count(*) FROM pg_unique")) {
        assertTrue(rs.next());
        assertEquals(1, rs.getLong(1));
      }
    }
  }

  @Test
  void databaseMetaDataDescribesTables() throws SQLException {
    try (Statement st = conn.createStatement()) {
      st.execute("CREATE TABLE pg_described (a BIGINT, b STRING, c DOUBLE, PRIMARY KEY (a, b))");
    }
    DatabaseMetaData meta = conn.getMetaData();
    List<String> tables = new ArrayList<>();
    try (ResultSet rs = meta.getTables(null, "public", "pg_desc%", new String[] {"TABLE"})) {
      while (rs.next()) {
        tables.add(rs.getString("TABLE_NAME"));
      }
    }
    assertEquals(List.of("pg_described"), tables);
    List<String> columns = new ArrayList<>();
    try (ResultSet rs = meta.getColumns(null, "public", "pg_described", null)) {
      while (rs.next()) {
        columns.add(rs.getString("COLUMN_NAME") + ":" + rs.getString("TYPE_NAME"));
      }
    }
    assertEquals(List.of("a:int8", "b:text", "c:float8"), columns);
    // The key, in key order, with the name PostgreSQL gives its constraint.
    List<String> keys = new ArrayList<>();
    try (ResultSet rs = meta.getPrimaryKeys(null, "public", "pg_described")) {
      while (rs.next()) {
        keys.add(rs.getString("COLUMN_NAME") + ":" + rs.getInt("KEY_SEQ") + ":" + rs.getString("PK_NAME"));
      }
    }
    assertEquals(List.of("a:1:pg_described_pkey", "b:2:pg_described_pkey"), keys);
    // The key's index, as BI tools read it to learn which columns identify a row.
    List<String> index = new ArrayList<>();
    try (ResultSet rs = meta.getIndexInfo(null, "public", "pg_described", true, false)) {
      while (rs.next()) {
        index.add(rs.getString("INDEX_NAME") + ":" + rs.getString("COLUMN_NAME"));
      }
    }
    assertEquals(List.of("pg_described_pkey:a", "pg_described_pkey:b"), index);
  }
}
