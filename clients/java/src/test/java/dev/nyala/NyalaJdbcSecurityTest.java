package dev.nyala;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The Flight SQL JDBC driver against a {@code nyala serve} with TLS and authentication.
 *
 * <p>The test makes a CA and a server certificate for localhost / 127.0.0.1 with the {@code
 * openssl} command, starts the server with {@code --tls-cert/--tls-key} and an administrator
 * ({@code --user/--password}), and connects with {@code useEncryption=true} trusting only that CA
 * ({@code tlsRootCerts}). It checks statements over TLS, that wrong passwords and plaintext
 * connections are refused, and that a second user needs a GRANT to read a table. The server's
 * stderr goes to target/nyala-security-server.log.
 */
class NyalaJdbcSecurityTest {
  private static final String ADMIN = "admin";
  private static final String ADMIN_PASSWORD = "admin-secret";

  private static Path pki;
  private static NyalaServerProcess server;
  private static Connection admin;

  @BeforeAll
  static void startServer() throws Exception {
    pki = Files.createTempDirectory("nyala-jdbc-pki-");
    makeCertificates(pki);
    server =
        NyalaServerProcess.start(
            "nyala-security-server.log",
            "--user", ADMIN,
            "--password", ADMIN_PASSWORD,
            "--tls-cert", pki.resolve("cert.pem").toString(),
            "--tls-key", pki.resolve("key.pem").toString());
    assertEquals("grpc+tls", server.scheme, "the server must say it serves TLS");
    admin = connect(ADMIN, ADMIN_PASSWORD);
  }

  @AfterAll
  static void stopServer() throws Exception {
    if (admin != null) {
      try {
        admin.close();
      } catch (SQLException ignored) {
        // The server is about to go anyway.
      }
      admin = null;
    }
    if (server != null) {
      server.close();
      server = null;
    }
    NyalaServerProcess.deleteTree(pki);
  }

  /** A CA and a server certificate it signed (rustls refuses a self-signed leaf). */
  private static void makeCertificates(Path dir) throws Exception {
    Files.writeString(
        dir.resolve("server.ext"),
        "basicConstraints=critical,CA:FALSE\n"
            + "keyUsage=critical,digitalSignature\n"
            + "extendedKeyUsage=serverAuth\n"
            + "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        StandardCharsets.UTF_8);
    openssl(dir, "req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=Nyala test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign");
    openssl(dir, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-keyout", "key.pem", "-out", "server.csr", "-subj", "/CN=localhost");
    openssl(dir, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-set_serial", "2", "-days", "2", "-sha256", "-extfile", "server.ext", "-out", "cert.pem");
  }

  private static void openssl(Path dir, String... args) throws Exception {
    List<String> command = new ArrayList<>();
    command.add("openssl");
    command.addAll(List.of(args));
    Path output = dir.resolve("openssl.log");
    Process p =
        new ProcessBuilder(command)
            .directory(dir.toFile())
            .redirectErrorStream(true)
            .redirectOutput(output.toFile())
            .start();
    if (!p.waitFor(60, TimeUnit.SECONDS)) {
      p.destroyForcibly();
      throw new IOException("openssl " + String.join(" ", args) + " did not finish");
    }
    if (p.exitValue() != 0) {
      throw new IOException(
          "openssl " + String.join(" ", args) + " failed: " + Files.readString(output));
    }
  }

  private static String tlsUrl() {
    return "jdbc:arrow-flight-sql://localhost:" + server.port
        + "/?useEncryption=true&useSystemTrustStore=false&tlsRootCerts="
        + pki.resolve("ca.pem");
  }

  private static Connection connect(String user, String password) throws SQLException {
    Properties props = new Properties();
    props.setProperty("user", user);
    props.setProperty("password", password);
    return DriverManager.getConnection(tlsUrl(), props);
  }

  /** The messages of `e` and all its causes, for looking for the server's words. */
  private static String messages(Throwable e) {
    StringBuilder all = new StringBuilder();
    for (Throwable t = e; t != null; t = t.getCause()) {
      all.append(t.getMessage()).append(" | ");
    }
    return all.toString();
  }

  private static List<String> column(Statement st, String sql) throws SQLException {
    List<String> values = new ArrayList<>();
    try (ResultSet rs = st.executeQuery(sql)) {
      while (rs.next()) {
        values.add(rs.getString(1));
      }
    }
    return values;
  }

  @Test
  void statementsRunOverTls() throws SQLException {
    try (Statement st = admin.createStatement()) {
      assertEquals(
          0,
          st.executeUpdate(
              "CREATE TABLE tls_t (id BIGINT NOT NULL, name STRING, PRIMARY KEY (id)) "
                  + "DISTRIBUTE BY HASH (id) INTO 2 BUCKETS"));
      assertEquals(3, st.executeUpdate("INSERT INTO tls_t VALUES (1, 'one'), (2, 'two'), (3, 'three')"));
      assertEquals(1, st.executeUpdate("UPDATE tls_t SET name = 'TWO' WHERE id = 2"));
      try (ResultSet rs = st.executeQuery("SELECT id, name FROM tls_t ORDER BY id")) {
        assertTrue(rs.next());
        assertEquals(1L, rs.getLong(1));
        assertEquals("one", rs.getString(2));
        assertTrue(rs.next());
        assertEquals(2L, rs.getLong(1));
        assertEquals("TWO", rs.getString(2));
        assertTrue(rs.next());
        assertEquals(3L, rs.getLong(1));
        assertEquals("three", rs.getString(2));
        assertFalse(rs.next());
      }
      assertTrue(column(st, "SHOW TABLES").contains("tls_t"));
    }
  }

  @Test
  void wrongPasswordsAreRefused() {
    SQLException wrong =
        assertThrows(SQLException.class, () -> connect(ADMIN, "not-the-password").close());
    assertTrue(
        messages(wrong).contains("invalid username or password"), "unexpected error: " + messages(wrong));
    SQLException unknown =
        assertThrows(SQLException.class, () -> connect("nobody", ADMIN_PASSWORD).close());
    assertTrue(
        messages(unknown).contains("invalid username or password"),
        "unexpected error: " + messages(unknown));
  }

  @Test
  void plaintextConnectionsAreRefused() {
    Properties props = new Properties();
    props.setProperty("user", ADMIN);
    props.setProperty("password", ADMIN_PASSWORD);
    String plain = "jdbc:arrow-flight-sql://localhost:" + server.port + "/?useEncryption=false";
    assertThrows(
        SQLException.class,
        () -> {
          try (Connection c = DriverManager.getConnection(plain, props);
              Statement st = c.createStatement()) {
            st.executeQuery("SELECT 1").close();
          }
        });
  }

  @Test
  void aCertificateFromAnUntrustedCaIsRefused() {
    // TLS, but trusting only the system's roots, which do not include the test CA.
    Properties props = new Properties();
    props.setProperty("user", ADMIN);
    props.setProperty("password", ADMIN_PASSWORD);
    String untrusting =
        "jdbc:arrow-flight-sql://localhost:" + server.port + "/?useEncryption=true&useSystemTrustStore=true";
    assertThrows(
        SQLException.class,
        () -> {
          try (Connection c = DriverManager.getConnection(untrusting, props);
              Statement st = c.createStatement()) {
            st.executeQuery("SELECT 1").close();
          }
        });
  }

  @Test
  void aSecondUserNeedsAGrantToRead() throws SQLException {
    try (Statement st = admin.createStatement()) {
      st.executeUpdate(
          "CREATE TABLE guarded (id BIGINT NOT NULL, secret STRING, PRIMARY KEY (id)) "
              + "DISTRIBUTE BY HASH (id) INTO 2 BUCKETS");
      st.executeUpdate("INSERT INTO guarded VALUES (1, 'a'), (2, 'b')");
      st.executeUpdate("CREATE USER bob WITH PASSWORD 'bob-secret'");
    }
    try (Connection bob = connect("bob", "bob-secret")) {
      try (Statement st = bob.createStatement()) {
        SQLException denied =
            assertThrows(SQLException.class, () -> column(st, "SELECT secret FROM guarded ORDER BY id"));
        assertTrue(
            messages(denied).contains(
                "permission denied: user bob lacks the SELECT privilege on table guarded"),
            "unexpected error: " + messages(denied));
        assertFalse(column(st, "SHOW TABLES").contains("guarded"));
      }

      try (Statement st = admin.createStatement()) {
        st.executeUpdate("GRANT SELECT ON guarded TO bob");
      }
      try (Statement st = bob.createStatement()) {
        assertEquals(List.of("a", "b"), column(st, "SELECT secret FROM guarded ORDER BY id"));
        assertTrue(column(st, "SHOW TABLES").contains("guarded"));
        // SELECT does not allow writing, and nothing was written.
        SQLException insert =
            assertThrows(
                SQLException.class, () -> st.executeUpdate("INSERT INTO guarded VALUES (3, 'c')"));
        assertTrue(
            messages(insert).contains("permission denied"), "unexpected error: " + messages(insert));
        assertEquals(List.of("a", "b"), column(st, "SELECT secret FROM guarded ORDER BY id"));
      }

      try (Statement st = admin.createStatement()) {
        st.executeUpdate("REVOKE SELECT ON guarded FROM bob");
      }
      try (Statement st = bob.createStatement()) {
        SQLException again =
            assertThrows(SQLException.class, () -> column(st, "SELECT secret FROM guarded"));
        assertTrue(
            messages(again).contains("permission denied"), "unexpected error: " + messages(again));
      }
    }
  }
}
