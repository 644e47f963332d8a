package aiolock.interop;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelOutboundHandlerAdapter;
import io.netty.channel.ChannelPromise;
import io.netty.bootstrap.Bootstrap;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;
import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;
import org.redisson.client.NettyHook;
import org.redisson.config.Config;

/**
 * Redisson's RLock measured for aiolock's benchmark (benchmarks/_redisson.py keeps one of these
 * JVMs per process of a scenario for the whole run and merges their records as it does the
 * Python peers').
 *
 * <p>Command line: --address redis://host:port [--database n]. The JVM makes one Redisson
 * client (Redisson's default config: pool sizes, threads, the 30 s watchdog: the figures a
 * Redisson user gets; only the idle connections' PING is off), prints {"started": true} and reads commands on stdin:
 *
 * <ul>
 *   <li>"prepare TAG THREADS OFFSET SHARED DURATION_MS WARMUP_MS": THREADS new threads (worker
 *       ids OFFSET..) that will loop lock()+unlock() on "TAG:lock" (SHARED) or
 *       "TAG:lock:&lt;worker&gt;", as the Python workers do, first run that loop on warm-up names
 *       for WARMUP_MS (the JIT compiles the path, the pools open); then {"ready": true}.
 *   <li>"go START_NS": the window opens at START_NS on CLOCK_MONOTONIC, which System.nanoTime()
 *       reads on Linux as Python's time.monotonic() does, so the records of both languages share
 *       one clock. After the window (plus a grace for acquisitions already waiting) one JSON line:
 *       the records [worker, t_wait, t_acq, t_rel, t_done] in seconds, the waits of threads still
 *       blocked, the JVM's CPU seconds and the requests it wrote in the window.
 *   <li>"exit": halt (every lock is released by then).
 * </ul>
 */
public final class Bench {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final PrintStream OUT =
      new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
          StandardCharsets.UTF_8);
  private static final int MAX_OPS = 1_000_000;
  private static final long GRACE_NS = 5_000_000_000L;
  /** Requests written to the server: one per command or batch, as the Python side counts. */
  private static final AtomicLong WRITES = new AtomicLong();

  private Bench() {}

  public static void main(String[] argv) {
    try {
      run(argv);
    } catch (Throwable error) {
      error.printStackTrace();
    }
    // Redisson's threads are not daemons; a blocked worker may still wait: end here.
    Runtime.getRuntime().halt(0);
  }

  /** What one worker thread records. */
  private static final class Worker extends Thread {
    final int id;
    final RLock lock;
    final RLock warm;
    final List<double[]> records = new ArrayList<>();
    volatile long waitingSince = -1;
    volatile String error;
    long warmUntil;
    long start;
    long deadline;
    final Object gate;
    CountDownLatch warmed;

    Worker(int id, RLock lock, RLock warm, Object gate) {
      super("bench-" + id);
      setDaemon(true);
      this.id = id;
      this.lock = lock;
      this.warm = warm;
      this.gate = gate;
    }

    @Override
    public void run() {
      try {
        try {
          while (System.nanoTime() < warmUntil) {
            warm.lock();
            warm.unlock();
          }
        } finally {
          warmed.countDown();
        }
        synchronized (gate) {
          while (start == 0) {
            gate.wait();
          }
        }
        long wait = start - System.nanoTime();
        if (wait > 0) {
          java.util.concurrent.locks.LockSupport.parkNanos(wait);
        }
        loop();
      } catch (RuntimeException | InterruptedException e) {
        error = e.getClass().getSimpleName() + ": " + e.getMessage();
      }
    }

    private void loop() {
      for (int i = 0; i < MAX_OPS && System.nanoTime() < deadline; i++) {
        long tWait = System.nanoTime();
        waitingSince = tWait;
        lock.lock();
        long tAcq = System.nanoTime();
        waitingSince = -1;
        long tRel = System.nanoTime();
        lock.unlock();
        long tDone = System.nanoTime();
        records.add(new double[] {id, tWait / 1e9, tAcq / 1e9, tRel / 1e9, tDone / 1e9});
      }
    }
  }

  private static void run(String[] argv) throws Exception {
    String address = "redis://127.0.0.1:6379";
    int database = 0;
    for (int i = 0; i < argv.length; i += 2) {
      String value = argv[i + 1];
      switch (argv[i]) {
        case "--address" -> address = value;
        case "--database" -> database = Integer.parseInt(value);
        default -> throw new IllegalArgumentException("unknown option " + argv[i]);
      }
    }
    Config config = new Config();
    // Redisson's defaults but for the connections' PING every 30 s: the JVM idles while the
    // Python peers are measured, and its PINGs would land in their server command counts.
    config.useSingleServer().setAddress(address).setDatabase(database).setPingConnectionInterval(0);
    // Counts what goes out: at the head of each connection's pipeline every message is one
    // encoded command or batch (one request, as redis-py's send_packed_command counts).
    config.setNettyHook(
        new NettyHook() {
          @Override
          public void afterBoostrapInitialization(Bootstrap bootstrap) {}

          @Override
          public void afterChannelInitialization(Channel channel) {
            channel
                .pipeline()
                .addFirst(
                    new ChannelOutboundHandlerAdapter() {
                      @Override
                      public void write(ChannelHandlerContext ctx, Object msg, ChannelPromise p)
                          throws Exception {
                        WRITES.incrementAndGet();
                        super.write(ctx, msg, p);
                      }
                    });
          }
        });
    RedissonClient redisson = Redisson.create(config);
    OUT.println("{\"started\": true}");
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    for (String line = in.readLine(); line != null; line = in.readLine()) {
      String[] words = line.trim().split(" ");
      if (words[0].equals("exit")) {
        return;
      }
      if (!words[0].equals("prepare")) {
        throw new IllegalArgumentException("unknown command " + line);
      }
      measure(
          redisson,
          in,
          words[1],
          Integer.parseInt(words[2]),
          Integer.parseInt(words[3]),
          Boolean.parseBoolean(words[4]),
          Long.parseLong(words[5]),
          Long.parseLong(words[6]));
    }
  }

  /**
   * One measurement: "prepare TAG THREADS OFFSET SHARED DURATION_MS WARMUP_MS" made the threads
   * and warmed them up; "go START_NS" starts them; one report line after the window.
   */
  private static void measure(
      RedissonClient redisson,
      BufferedReader in,
      String tag,
      int threads,
      int offset,
      boolean shared,
      long durationMs,
      long warmupMs)
      throws Exception {
    Object gate = new Object();
    List<Worker> workers = new ArrayList<>();
    CountDownLatch warmed = new CountDownLatch(threads);
    long warmUntil = System.nanoTime() + warmupMs * 1_000_000L;
    for (int i = 0; i < threads; i++) {
      int id = offset + i;
      String name = shared ? tag + ":lock" : tag + ":lock:" + id;
      // The warm-up has the measurement's shape (one name per JVM when shared: its threads
      // contend, so the waiting path is compiled too) on names of its own.
      String warm = shared ? tag + ":warm:" + offset : tag + ":warm:" + id;
      Worker w = new Worker(id, redisson.getLock(name), redisson.getLock(warm), gate);
      w.warmUntil = warmUntil;
      w.warmed = warmed;
      workers.add(w);
      w.start();
    }
    // Ready once every thread has finished its warm-up pairs (and waits at the gate): none
    // of their commands may fall after the parent's first reading of the server's counters.
    warmed.await();
    OUT.println("{\"ready\": true}");
    String line = in.readLine();
    if (line == null || !line.startsWith("go ")) {
      throw new IllegalStateException("expected go, got " + line);
    }
    long start = Long.parseLong(line.substring(3).trim());
    long deadline = start + durationMs * 1_000_000L;
    var os =
        (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    synchronized (gate) {
      for (Worker w : workers) {
        w.start = start;
        w.deadline = deadline;
      }
      gate.notifyAll();
    }
    long wait = start - System.nanoTime();
    if (wait > 0) {
      java.util.concurrent.locks.LockSupport.parkNanos(wait);
    }
    long cpu0 = os.getProcessCpuTime();
    long writes0 = WRITES.get();
    int stragglers = 0;
    for (Worker w : workers) {
      long rest = deadline + GRACE_NS - System.nanoTime();
      if (rest > 0) {
        w.join(rest / 1_000_000L + 1);
      }
      if (w.isAlive()) {
        stragglers++;
      }
    }
    long cpu = os.getProcessCpuTime() - cpu0;
    long writes = WRITES.get() - writes0;
    ObjectNode out = JSON.createObjectNode();
    ArrayNode records = out.putArray("records");
    ArrayNode stuck = out.putArray("stuck");
    ArrayNode errors = out.putArray("errors");
    for (Worker w : workers) {
      if (w.isAlive()) {
        long since = w.waitingSince;
        if (since > 0) {
          stuck.add(since / 1e9);
        }
        continue; // its records list may still change
      }
      if (w.error != null) {
        errors.add(w.error);
      }
      for (double[] r : w.records) {
        ArrayNode row = records.addArray();
        row.add((int) r[0]);
        for (int k = 1; k < 5; k++) {
          row.add(r[k]);
        }
      }
    }
    out.put("cpu_s", cpu / 1e9);
    out.put("round_trips", writes);
    out.put("stragglers", stragglers);
    out.put("t_start", start / 1e9);
    OUT.println(JSON.writeValueAsString(out));
  }
}
