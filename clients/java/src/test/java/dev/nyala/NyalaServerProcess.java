package dev.nyala;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * A {@code nyala serve} process on a fresh data directory and a free port, for tests.
 *
 * <p>The binary is $NYALA_BIN, else {@code debug/nyala} in $CARGO_TARGET_DIR (default
 * ~/.cache/nyala-target), else the repository's own target/. The server's stderr goes to
 * {@code target/<logName>}; its stdout is drained so it never blocks.
 */
final class NyalaServerProcess implements AutoCloseable {
  /** "Nyala listening on grpc://HOST:PORT and http://..." or, with TLS, "grpc+tls://HOST:PORT". */
  private static final Pattern LISTENING = Pattern.compile("(grpc(?:\\+tls)?)://([^\\s:]+):(\\d+)");
  /** "Nyala PostgreSQL protocol listening on HOST:PORT", the line after. */
  private static final Pattern POSTGRES = Pattern.compile("PostgreSQL protocol listening on ([^\\s:]+):(\\d+)");

  private final Process process;
  private final Path dataDir;
  /** "grpc" or "grpc+tls". */
  final String scheme;

  final String host;
  final int port;
  /** Where the PostgreSQL protocol listens. */
  final int pgPort;

  private NyalaServerProcess(
      Process process, Path dataDir, String scheme, String host, int port, int pgPort) {
    this.process = process;
    this.dataDir = dataDir;
    this.scheme = scheme;
    this.host = host;
    this.port = port;
    this.pgPort = pgPort;
  }

  /** A pgjdbc URL of the server's PostgreSQL protocol. */
  String postgresUrl() {
    return "jdbc:postgresql://" + host + ":" + pgPort + "/nyala";
  }

  /** Starts {@code nyala serve} with {@code extraArgs}; fails if it does not say where it listens. */
  static NyalaServerProcess start(String logName, String... extraArgs) throws Exception {
    Path binary = binary();
    if (!Files.isExecutable(binary)) {
      throw new IllegalStateException("no nyala binary at " + binary + ": build it or set NYALA_BIN");
    }
    Path dataDir = Files.createTempDirectory("nyala-jdbc-");
    Path log = Path.of("target", logName).toAbsolutePath();
    Files.createDirectories(log.getParent());
    List<String> command = new ArrayList<>(List.of(binary.toString(), "serve", "--data-dir",
        dataDir.toString(), "--listen", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0"));
    command.addAll(List.of(extraArgs));
    Process process =
        new ProcessBuilder(command).redirectError(ProcessBuilder.Redirect.to(log.toFile())).start();

    BufferedReader stdout =
        new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
    CompletableFuture<String> firstLines =
        CompletableFuture.supplyAsync(
            () -> {
              try {
                return stdout.readLine() + "\n" + stdout.readLine();
              } catch (IOException e) {
                return null;
              }
            });
    String line;
    try {
      line = firstLines.get(60, TimeUnit.SECONDS);
    } catch (Exception e) {
      line = null;
    }
    Matcher m = line == null ? null : LISTENING.matcher(line);
    Matcher pg = line == null ? null : POSTGRES.matcher(line);
    if (m == null || !m.find() || !pg.find()) {
      stop(process);
      deleteTree(dataDir);
      throw new IllegalStateException(
          "nyala serve did not start; first stdout line: " + line + " (stderr in " + log + ")");
    }
    Thread drain =
        new Thread(
            () -> {
              try {
                while (stdout.readLine() != null) {}
              } catch (IOException ignored) {
                // The server is gone.
              }
            },
            "nyala-stdout-" + logName);
    drain.setDaemon(true);
    drain.start();
    return new NyalaServerProcess(
        process,
        dataDir,
        m.group(1),
        m.group(2),
        Integer.parseInt(m.group(3)),
        Integer.parseInt(pg.group(2)));
  }

  @Override
  public void close() throws Exception {
    stop(process);
    deleteTree(dataDir);
  }

  private static void stop(Process process) throws InterruptedException {
    process.destroy();
    if (!process.waitFor(10, TimeUnit.SECONDS)) {
      process.destroyForcibly();
      process.waitFor(10, TimeUnit.SECONDS);
    }
  }

  static void deleteTree(Path root) throws IOException {
    if (root == null || !Files.exists(root)) {
      return;
    }
    try (Stream<Path> paths = Files.walk(root)) {
      paths.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
    }
  }

  static Path binary() {
    String explicit = System.getenv("NYALA_BIN");
    if (explicit != null && !explicit.isEmpty()) {
      return Path.of(explicit);
    }
    List<Path> candidates = new ArrayList<>();
    String targetDir = System.getenv("CARGO_TARGET_DIR");
    if (targetDir != null && !targetDir.isEmpty()) {
      candidates.add(Path.of(targetDir, "debug", "nyala"));
    }
    candidates.add(Path.of(System.getProperty("user.home"), ".cache", "nyala-target", "debug", "nyala"));
    // clients/java -> repository root.
    candidates.add(Path.of("..", "..", "target", "debug", "nyala").toAbsolutePath().normalize());
    return candidates.stream().filter(Files::exists).findFirst().orElse(candidates.get(0));
  }
}
