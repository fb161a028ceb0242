package dev.nyala;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Multi-statement transactions through the Apache Arrow Flight SQL JDBC driver.
 *
 * <p>Driver 18.3 implements {@link Connection#commit()} and {@link Connection#rollback()} as
 * no-ops and {@link Connection#setAutoCommit(boolean)} only locally, so a JDBC user runs a
 * transaction with the SQL statements {@code BEGIN}, {@code COMMIT} and {@code ROLLBACK}. Each
 * JDBC connection is its own server session, hence its own transaction. The tests share one
 * {@link NyalaServerProcess} (stderr in target/nyala-server-txn.log) and use their own tables.
 */
class NyalaJdbcTransactionTest {
  private static final String CONFLICT = "could not serialize access";

  private static NyalaServerProcess server;
  private static String url;

  @BeforeAll
  static void startServer() throws Exception {
    server = NyalaServerProcess.start("nyala-server-txn.log");
    assertEquals("grpc", server.scheme, "the server must serve plaintext gRPC");
    url = "jdbc:arrow-flight-sql://" + server.host + ":" + server.port + "/?useEncryption=false";
  }

  @AfterAll
  static void stopServer() throws Exception {
    if (server != null) {
      server.close();
      server = null;
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 1. BEGIN / COMMIT / ROLLBACK: own writes read back, invisible elsewhere until COMMIT,
  //    discarded by ROLLBACK; prepared statements run inside the transaction.

  @Test
  void beginCommitRollback() throws SQLException {
    try (Connection a = DriverManager.getConnection(url);
        Connection b = DriverManager.getConnection(url);
        Statement sa = a.createStatement();
        Statement sb = b.createStatement()) {
      exec(
          sa,
          "CREATE TABLE txn_basic (id BIGINT, v BIGINT, PRIMARY KEY (id)) "
              + "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS");
      assertEquals(1, count(sa, "INSERT INTO txn_basic VALUES (1, 10)"));
      String all = "SELECT id, v FROM txn_basic ORDER BY id";

      // BEGIN, INSERT: seen here, not by the other connection until COMMIT.
      exec(sa, "BEGIN");
      assertEquals(1, count(sa, "INSERT INTO txn_basic VALUES (2, 20)"));
      assertEquals(rows("1", "10", "2", "20"), query(sa, all), "the transaction reads its own insert");
      assertEquals(rows("1", "10"), query(sb, all), "another connection does not see the uncommitted insert");
      exec(sa, "COMMIT");
      assertEquals(rows("1", "10", "2", "20"), query(sb, all), "the other connection sees the committed insert");
      assertEquals(rows("1", "10", "2", "20"), query(sa, all));

      // START TRANSACTION, UPDATE, ROLLBACK: the update is seen inside only, then discarded.
      exec(sa, "START TRANSACTION");
      assertEquals(1, count(sa, "UPDATE txn_basic SET v = 99 WHERE id = 1"));
      assertEquals(rows("1", "99", "2", "20"), query(sa, all), "the transaction reads its own update");
      assertEquals(rows("1", "10", "2", "20"), query(sb, all), "the uncommitted update is not seen elsewhere");
      exec(sa, "ROLLBACK");
      assertEquals(rows("1", "10", "2", "20"), query(sa, all), "ROLLBACK discards the update");
      assertEquals(rows("1", "10", "2", "20"), query(sb, all));

      // A transaction reads at its snapshot: a commit by another connection after the
      // transaction's first statement is not seen in it, and is seen after it ends.
      exec(sa, "BEGIN");
      assertEquals(rows("1", "10", "2", "20"), query(sa, all));
      assertEquals(1, count(sb, "INSERT INTO txn_basic VALUES (3, 30)"));
      assertEquals(rows("1", "10", "2", "20"), query(sa, all), "a later commit of another connection is not seen");
      exec(sa, "COMMIT");
      assertEquals(rows("1", "10", "2", "20", "3", "30"), query(sa, all), "after COMMIT the new snapshot sees it");

      // Prepared statements with parameters inside a transaction, prepared in it, then reused
      // in the next one.
      exec(sa, "BEGIN");
      try (PreparedStatement upd = a.prepareStatement("UPDATE txn_basic SET v = ? WHERE id = ?");
          PreparedStatement sel = a.prepareStatement("SELECT v FROM txn_basic WHERE id = ?")) {
        upd.setLong(1, 111);
        upd.setLong(2, 1);
        assertEquals(1, upd.executeUpdate(), "prepared UPDATE in a transaction");
        sel.setLong(1, 1);
        assertEquals(111L, single(sel), "a prepared SELECT in the transaction reads its own update");
        assertEquals(rows("1", "10", "2", "20", "3", "30"), query(sb, all), "not seen elsewhere before COMMIT");
        exec(sa, "ROLLBACK");
        assertEquals(10L, single(sel), "ROLLBACK discards the prepared UPDATE");
        assertEquals(rows("1", "10", "2", "20", "3", "30"), query(sb, all));

        exec(sa, "BEGIN");
        upd.setLong(1, 222);
        upd.setLong(2, 2);
        assertEquals(1, upd.executeUpdate(), "prepared UPDATE in the next transaction");
        sel.setLong(1, 2);
        assertEquals(222L, single(sel));
        assertEquals(rows("1", "10", "2", "20", "3", "30"), query(sb, all), "not seen elsewhere before COMMIT");
        exec(sa, "COMMIT");
        assertEquals(rows("1", "10", "2", "222", "3", "30"), query(sb, all), "the prepared UPDATE is committed");
      }

      // DELETE and INSERT in one transaction, committed together.
      exec(sa, "BEGIN");
      assertEquals(1, count(sa, "DELETE FROM txn_basic WHERE id = 3"));
      assertEquals(1, count(sa, "INSERT INTO txn_basic VALUES (4, 40)"));
      assertEquals(rows("1", "10", "2", "222", "4", "40"), query(sa, all), "own delete and insert read back");
      assertEquals(rows("1", "10", "2", "222", "3", "30"), query(sb, all));
      exec(sa, "COMMIT");
      assertEquals(rows("1", "10", "2", "222", "4", "40"), query(sb, all));

      exec(sa, "DROP TABLE txn_basic");
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 1b. Queries that read no column of the table (count(*), a constant per row) count the
  //     transaction's own writes too.

  @Test
  void countsReadOwnWrites() throws SQLException {
    try (Connection a = DriverManager.getConnection(url);
        Connection b = DriverManager.getConnection(url);
        Statement sa = a.createStatement();
        Statement sb = b.createStatement()) {
      exec(
          sa,
          "CREATE TABLE txn_count (id BIGINT, v BIGINT, PRIMARY KEY (id)) "
              + "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS");
      assertEquals(2, count(sa, "INSERT INTO txn_count VALUES (1, 10), (2, 20)"));
      exec(sa, "BEGIN");
      assertEquals(1, count(sa, "INSERT INTO txn_count VALUES (3, 30)"));
      assertEquals(1, count(sa, "DELETE FROM txn_count WHERE id = 1"));
      assertEquals(
          List.of(List.of("2", "50")),
          query(sa, "SELECT count(v), sum(v) FROM txn_count"),
          "count(v) and sum(v) see the own insert and delete");
      try {
        assertEquals(List.of(List.of("2")), query(sa, "SELECT count(*) FROM txn_count"), "count(*) in the transaction");
        assertEquals(
            List.of(List.of("1"), List.of("1")), query(sa, "SELECT 1 FROM txn_count"), "a constant per row in the transaction");
      } finally {
        exec(sa, "COMMIT");
      }
      assertEquals(List.of(List.of("2")), query(sb, "SELECT count(*) FROM txn_count"));
      exec(sa, "DROP TABLE txn_count");
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 2. Concurrent transfers between accounts: with first-writer-wins and retries no money is
  //    created or lost, and every balance is its initial value plus the committed transfers.

  @Test
  void concurrentTransfersKeepTheTotal() throws Exception {
    int accounts = 10;
    long initial = 1000;
    int clients = 8;
    int transfersPerClient = 20;
    int maxAttempts = 500;
    try (Connection c = DriverManager.getConnection(url);
        Statement st = c.createStatement()) {
      exec(
          st,
          "CREATE TABLE txn_accounts (id BIGINT, balance BIGINT, PRIMARY KEY (id)) "
              + "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS");
      assertEquals(
          accounts,
          count(st, "INSERT INTO txn_accounts SELECT value, " + initial + " FROM generate_series(0, " + (accounts - 1) + ")"));
    }

    long[] committedDelta = new long[accounts];
    AtomicLong committed = new AtomicLong();
    AtomicLong conflicts = new AtomicLong();
    List<String> failures = Collections.synchronizedList(new ArrayList<>());
    ExecutorService pool = Executors.newFixedThreadPool(clients);
    List<Future<?>> futures = new ArrayList<>();
    for (int t = 0; t < clients; t++) {
      int client = t;
      futures.add(
          pool.submit(
              () -> {
                Random random = new Random(client);
                try (Connection own = DriverManager.getConnection(url);
                    Statement st = own.createStatement();
                    PreparedStatement read = own.prepareStatement("SELECT balance FROM txn_accounts WHERE id = ?");
                    PreparedStatement write = own.prepareStatement("UPDATE txn_accounts SET balance = ? WHERE id = ?")) {
                  for (int i = 0; i < transfersPerClient; i++) {
                    int from = random.nextInt(accounts);
                    int to = (from + 1 + random.nextInt(accounts - 1)) % accounts;
                    long amount = 1 + random.nextInt(50);
                    boolean done = false;
                    for (int attempt = 0; attempt < maxAttempts && !done; attempt++) {
                      try {
                        exec(st, "BEGIN");
                        long fromBalance = balance(read, from);
                        long toBalance = balance(read, to);
                        write.setLong(1, fromBalance - amount);
                        write.setLong(2, from);
                        int n1 = write.executeUpdate();
                        write.setLong(1, toBalance + amount);
                        write.setLong(2, to);
                        int n2 = write.executeUpdate();
                        if (n1 != 1 || n2 != 1) {
                          failures.add("client " + client + ": UPDATEs reported " + n1 + " and " + n2 + " rows");
                        }
                        exec(st, "COMMIT");
                        synchronized (committedDelta) {
                          committedDelta[from] -= amount;
                          committedDelta[to] += amount;
                        }
                        committed.incrementAndGet();
                        done = true;
                      } catch (SQLException e) {
                        if (!chainContains(e, CONFLICT)) {
                          throw e;
                        }
                        conflicts.incrementAndGet();
                        exec(st, "ROLLBACK");
                        Thread.sleep(random.nextInt(5));
                      }
                    }
                    if (!done) {
                      failures.add("client " + client + ": transfer " + i + " still conflicting after " + maxAttempts + " attempts");
                    }
                  }
                } catch (Exception e) {
                  failures.add("client " + client + ": " + chain(e));
                }
                return null;
              }));
    }
    pool.shutdown();
    for (Future<?> f : futures) {
      f.get(10, TimeUnit.MINUTES); // a safety net against a hang, not a timing assertion
    }
    assertEquals(List.of(), failures, "every transfer commits, after retries on conflicts");
    assertEquals((long) clients * transfersPerClient, committed.get());
    System.out.println("transfers: " + committed.get() + " committed, " + conflicts.get() + " conflicts retried");

    List<List<String>> want = new ArrayList<>();
    for (int k = 0; k < accounts; k++) {
      want.add(List.of("" + k, "" + (initial + committedDelta[k])));
    }
    try (Connection c = DriverManager.getConnection(url);
        Statement st = c.createStatement()) {
      assertEquals(
          List.of(List.of("" + accounts * initial)),
          query(st, "SELECT sum(balance) FROM txn_accounts"),
          "the total is unchanged");
      assertEquals(
          want,
          query(st, "SELECT id, balance FROM txn_accounts ORDER BY id"),
          "every balance is its initial value plus the committed transfers");
      exec(st, "DROP TABLE txn_accounts");
    }
  }

  // ---------------------------------------------------------------------------------------------
  // 3. A write conflict: the second writer fails at once, its transaction is rolled back and
  //    refuses statements until ROLLBACK; only the first writer's value is committed.

  @Test
  void conflictIsReportedAndRollsBack() throws SQLException {
    try (Connection a = DriverManager.getConnection(url);
        Connection b = DriverManager.getConnection(url);
        Statement sa = a.createStatement();
        Statement sb = b.createStatement()) {
      exec(
          sa,
          "CREATE TABLE txn_conflict (id BIGINT, v BIGINT, PRIMARY KEY (id)) "
              + "DISTRIBUTE BY HASH (id) INTO 4 BUCKETS");
      assertEquals(2, count(sa, "INSERT INTO txn_conflict VALUES (1, 100), (2, 200)"));
      String row1 = "SELECT v FROM txn_conflict WHERE id = 1";

      // The first writer holds the row; the second writer's UPDATE of it fails at once.
      exec(sa, "BEGIN");
      assertEquals(1, count(sa, "UPDATE txn_conflict SET v = 101 WHERE id = 1"));
      exec(sb, "BEGIN");
      assertEquals(1, count(sb, "UPDATE txn_conflict SET v = 201 WHERE id = 2"), "a row nobody else writes");
      SQLException conflict =
          assertThrows(SQLException.class, () -> sb.executeUpdate("UPDATE txn_conflict SET v = 102 WHERE id = 1"));
      assertChainContains(conflict, CONFLICT);

      // The second transaction is rolled back: its statements fail until ROLLBACK.
      SQLException refused = assertThrows(SQLException.class, () -> query(sb, row1));
      assertChainContains(refused, "ROLLBACK");
      SQLException refusedAgain =
          assertThrows(SQLException.class, () -> sb.executeUpdate("UPDATE txn_conflict SET v = 202 WHERE id = 2"));
      assertChainContains(refusedAgain, "ROLLBACK");
      exec(sb, "ROLLBACK");
      assertEquals(List.of(List.of("100")), query(sb, row1), "after ROLLBACK: the first writer has not committed");
      assertEquals(
          List.of(List.of("200")),
          query(sb, "SELECT v FROM txn_conflict WHERE id = 2"),
          "the rolled-back transaction's other write is discarded");

      exec(sa, "COMMIT");
      assertEquals(List.of(List.of("101")), query(sb, row1), "only the first writer's value is committed");
      assertEquals(List.of(List.of("101")), query(sa, row1));
      assertEquals(List.of(List.of("200")), query(sa, "SELECT v FROM txn_conflict WHERE id = 2"));

      // A row committed by another connection after the transaction's snapshot: writing it
      // conflicts too (first committer wins), and the transaction rolls back the same way.
      exec(sa, "BEGIN");
      assertEquals(List.of(List.of("101")), query(sa, row1), "takes the snapshot");
      assertEquals(1, count(sb, "UPDATE txn_conflict SET v = 300 WHERE id = 1"));
      SQLException stale =
          assertThrows(SQLException.class, () -> sa.executeUpdate("UPDATE txn_conflict SET v = v + 1 WHERE id = 1"));
      assertChainContains(stale, CONFLICT);
      SQLException staleRefused = assertThrows(SQLException.class, () -> query(sa, row1));
      assertChainContains(staleRefused, "ROLLBACK");
      exec(sa, "ROLLBACK");
      assertEquals(List.of(List.of("300")), query(sa, row1), "the other connection's committed value stays");

      exec(sa, "DROP TABLE txn_conflict");
    }
  }

  // ---------------------------------------------------------------------------------------------

  /** Runs a statement whose result does not matter (BEGIN, COMMIT, DDL), closing any result set. */
  private static void exec(Statement st, String sql) throws SQLException {
    if (st.execute(sql)) {
      st.getResultSet().close();
    }
  }

  /** A DML statement's row count: its update count, or the one value of its result set. */
  private static long count(Statement st, String sql) throws SQLException {
    if (st.execute(sql)) {
      List<List<String>> rows = readRows(st.getResultSet());
      assertEquals(1, rows.size(), sql + " returns one count row");
      return Long.parseLong(rows.get(0).get(0));
    }
    return st.getUpdateCount();
  }

  private static List<List<String>> query(Statement st, String sql) throws SQLException {
    return readRows(st.executeQuery(sql));
  }

  /** The one BIGINT a prepared query returns. */
  private static long single(PreparedStatement ps) throws SQLException {
    List<List<String>> rows = readRows(ps.executeQuery());
    assertEquals(1, rows.size(), "one row: " + rows);
    return Long.parseLong(rows.get(0).get(0));
  }

  private static long balance(PreparedStatement read, long id) throws SQLException {
    read.setLong(1, id);
    try (ResultSet rs = read.executeQuery()) {
      if (!rs.next()) {
        throw new IllegalStateException("account " + id + " not found");
      }
      long balance = rs.getLong(1);
      if (rs.next()) {
        throw new IllegalStateException("account " + id + " found twice");
      }
      return balance;
    }
  }

  /** Rows of (id, v) pairs given flat, as strings. */
  private static List<List<String>> rows(String... flat) {
    List<List<String>> out = new ArrayList<>();
    for (int i = 0; i < flat.length; i += 2) {
      out.add(List.of(flat[i], flat[i + 1]));
    }
    return out;
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

  private static String chain(Throwable e) {
    StringBuilder all = new StringBuilder();
    for (Throwable t = e; t != null; t = t.getCause()) {
      all.append(t.getClass().getSimpleName()).append(": ").append(t.getMessage()).append('\n');
    }
    return all.toString();
  }

  private static boolean chainContains(Throwable e, String needle) {
    return chain(e).toLowerCase().contains(needle.toLowerCase());
  }

  private static void assertChainContains(Throwable e, String needle) {
    assertTrue(chainContains(e, needle), "expected '" + needle + "' along the cause chain:\n" + chain(e));
  }
}
