package aiolock.interop;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import org.redisson.Redisson;
import org.redisson.RedissonMultiLock;
import org.redisson.api.RAtomicLong;
import org.redisson.api.RBucket;
import org.redisson.api.RCountDownLatch;
import org.redisson.api.RLock;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RSemaphore;
import org.redisson.api.RedissonClient;
import org.redisson.client.codec.StringCodec;
import org.redisson.config.Config;
import org.redisson.config.ClusterServersConfig;
import org.redisson.config.ReadMode;
import org.redisson.config.SubscriptionMode;

/**
 * Drives one Redisson client for aiolock's interop tests (tests/redisson_driver.py).
 *
 * <p>Reads one JSON command a line on stdin: {"id": 1, "thread": "t1", "kind": "lock", "name":
 * "x", "op": "tryLock", "args": {"wait": 1000, "lease": 500}} (times in milliseconds). Redisson's
 * holder identity is the calling thread, so every command runs on the worker thread its "thread"
 * names (created on first use, one single-thread executor each): a blocking op blocks that thread
 * only, and the stdin loop goes on reading. Each command gets one reply line with its id:
 * {"id": 1, "ok": true, "value": ...} or {"id": 1, "ok": false, "error": "<exception class>",
 * "message": "..."}. The first line out is {"ready": true, "client": <uuid>, ...}.
 *
 * <p>Command line: --address redis://host:port [--database n] | --cluster redis://host:port,...
 * [--watchdog ms] [--codec
 * <codec class>] [--prefix p] [--fair-wait-timeout ms] [--version v].
 */
public final class Driver {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final PrintStream OUT =
      new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
          StandardCharsets.UTF_8);
  private static final Map<String, ExecutorService> THREADS = new ConcurrentHashMap<>();
  private static RedissonClient redisson;

  private Driver() {}

  public static void main(String[] argv) {
    try {
      serve(argv);
    } catch (Throwable error) {
      // Redisson's threads are not daemons: without this the JVM would live on, unanswering.
      error.printStackTrace();
      Runtime.getRuntime().halt(1);
    }
  }

  private static void serve(String[] argv) throws Exception {
    Config config = new Config();
    String address = "redis://127.0.0.1:6379";
    int database = 0;
    String prefix = null;
    String cluster = null;
    String version = "?";
    long fairWaitTimeout = -1;
    boolean fairWaitSettable = true;
    for (int i = 0; i < argv.length; i += 2) {
      String value = argv[i + 1];
      switch (argv[i]) {
        case "--address" -> address = value;
        case "--database" -> database = Integer.parseInt(value);
        case "--watchdog" -> config.setLockWatchdogTimeout(Long.parseLong(value));
        case "--codec" -> config.setCodec(
            (org.redisson.client.codec.Codec)
                Class.forName(value).getDeclaredConstructor().newInstance());
        case "--prefix" -> prefix = value;
        case "--cluster" -> cluster = value;
        case "--fair-wait-timeout" -> fairWaitTimeout = Long.parseLong(value);
        case "--version" -> version = value;
        default -> throw new IllegalArgumentException("unknown option " + argv[i]);
      }
    }
    // Small pools: a test JVM starts in a second instead of opening 24 connections and 32
    // Netty threads on a shared 2-core machine.
    config.setThreads(2).setNettyThreads(4);
    Object server;
    if (cluster == null) {
      server =
          config
              .useSingleServer()
              .setAddress(address)
              .setDatabase(database)
              .setConnectionMinimumIdleSize(2)
              .setConnectionPoolSize(16)
              .setSubscriptionConnectionMinimumIdleSize(1);
    } else {
      // Every node given ("redis://host:port,..."); reads from the primaries, as aiolock's,
      // so that a test reads what it just wrote.
      ClusterServersConfig nodes =
          config
              .useClusterServers()
              .setReadMode(ReadMode.MASTER)
              .setSubscriptionMode(SubscriptionMode.MASTER)
              .setMasterConnectionMinimumIdleSize(1)
              .setMasterConnectionPoolSize(8)
              .setSlaveConnectionMinimumIdleSize(1)
              .setSlaveConnectionPoolSize(2)
              .setSubscriptionConnectionMinimumIdleSize(1);
      for (String node : cluster.split(",")) {
        nodes.addNodeAddress(node);
      }
      server = nodes;
    }
    if (prefix != null) {
      setNameMapper(config, server, prefix);
    }
    // Config.setFairLockWaitTimeout came in 3.46; before it the timeout is fixed (5 min). The
    // ready line says which ("fairWaitTimeout").
    try {
      Method setter = Config.class.getMethod("setFairLockWaitTimeout", long.class);
      if (fairWaitTimeout >= 0) {
        setter.invoke(config, fairWaitTimeout);
      }
    } catch (NoSuchMethodException e) {
      fairWaitSettable = false;
    }
    redisson = Redisson.create(config);
    ObjectNode ready = JSON.createObjectNode();
    ready.put("ready", true);
    ready.put("client", redisson.getId());
    ready.put("version", version);
    ready.put("watchdog", config.getLockWatchdogTimeout());
    ready.put("fairWaitTimeout", fairWaitSettable);
    ready.put("spinLock", has("getSpinLock"));
    ready.put("fencedLock", has("getFencedLock"));
    emit(ready);

    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line;
    while ((line = in.readLine()) != null) {
      if (line.isBlank()) {
        continue;
      }
      JsonNode command = JSON.readTree(line);
      long id = command.path("id").asLong();
      String op = command.path("op").asText();
      if (op.equals("crash")) {
        // A process killed while holding: no unlock, no shutdown, the watchdog stops with it.
        Runtime.getRuntime().halt(137);
      }
      if (op.equals("exit")) {
        break;
      }
      String thread = command.path("thread").asText("main");
      ExecutorService executor = THREADS.computeIfAbsent(thread, Driver::newThread);
      executor.execute(() -> reply(id, command));
    }
    for (ExecutorService executor : THREADS.values()) {
      executor.shutdownNow();
    }
    // No quiet period: the tests wait for this line.
    redisson.shutdown(0, 2, TimeUnit.SECONDS);
    ObjectNode bye = JSON.createObjectNode();
    bye.put("exited", true);
    emit(bye);
    System.exit(0);
  }

  private static ExecutorService newThread(String name) {
    return Executors.newSingleThreadExecutor(
        runnable -> {
          Thread thread = new Thread(runnable, "driver-" + name);
          thread.setDaemon(true);
          return thread;
        });
  }

  private static boolean has(String method) {
    try {
      RedissonClient.class.getMethod(method, String.class);
      return true;
    } catch (NoSuchMethodException e) {
      return false;
    }
  }

  /** A NameMapper prefixing every name: on Config in 4.x, on the server config in 3.x. */
  private static void setNameMapper(Config config, Object server, String prefix)
      throws Exception {
    // org.redisson.api.NameMapper in 3.x, org.redisson.config.NameMapper in 4.x.
    Class<?> mapperType;
    try {
      mapperType = Class.forName("org.redisson.config.NameMapper");
    } catch (ClassNotFoundException e) {
      mapperType = Class.forName("org.redisson.api.NameMapper");
    }
    Object mapper =
        Proxy.newProxyInstance(
            mapperType.getClassLoader(),
            new Class<?>[] {mapperType},
            (proxy, method, args) -> {
              return switch (method.getName()) {
                case "map" -> prefix + args[0];
                case "unmap" -> {
                  String name = (String) args[0];
                  yield name.startsWith(prefix) ? name.substring(prefix.length()) : name;
                }
                case "hashCode" -> System.identityHashCode(proxy);
                case "equals" -> proxy == args[0];
                default -> "NameMapper(" + prefix + ")";
              };
            });
    try {
      Config.class.getMethod("setNameMapper", mapperType).invoke(config, mapper);
    } catch (NoSuchMethodException e) {
      server.getClass().getMethod("setNameMapper", mapperType).invoke(server, mapper);
    }
  }

  private static synchronized void emit(JsonNode node) {
    OUT.println(node.toString());
  }

  private static void reply(long id, JsonNode command) {
    ObjectNode answer = JSON.createObjectNode();
    answer.put("id", id);
    try {
      Object value = run(command);
      answer.put("ok", true);
      answer.set("value", JSON.valueToTree(value));
    } catch (Throwable error) {
      Throwable cause = error;
      while (cause instanceof InvocationTargetException && cause.getCause() != null) {
        cause = cause.getCause();
      }
      answer.put("ok", false);
      answer.put("error", cause.getClass().getSimpleName());
      answer.put("message", String.valueOf(cause.getMessage()));
    }
    emit(answer);
  }

  private static long ms(JsonNode args, String field, long otherwise) {
    JsonNode node = args.get(field);
    return node == null || node.isNull() ? otherwise : node.asLong();
  }

  private static Object run(JsonNode command) throws Exception {
    String kind = command.path("kind").asText();
    String name = command.path("name").asText();
    String op = command.path("op").asText();
    JsonNode args = command.path("args");
    switch (kind) {
      case "thread":
        // The worker's Redisson holder id is "<client id>:<thread id>".
        return Thread.currentThread().getId();
      case "lock":
        return lockOp(redisson.getLock(name), op, args);
      case "fair":
        return lockOp(redisson.getFairLock(name), op, args);
      case "read":
        return lockOp(redisson.getReadWriteLock(name).readLock(), op, args);
      case "write":
        return lockOp(redisson.getReadWriteLock(name).writeLock(), op, args);
      case "spin":
        return lockOp(optionalLock("getSpinLock", name), op, args);
      case "fenced":
        return lockOp(optionalLock("getFencedLock", name), op, args);
      case "multi":
        {
          List<RLock> members = new ArrayList<>();
          for (JsonNode member : args.path("names")) {
            members.add(redisson.getLock(member.asText()));
          }
          return lockOp(new RedissonMultiLock(members.toArray(new RLock[0])), op, args);
        }
      case "semaphore":
        return semaphoreOp(redisson.getSemaphore(name), op, args);
      case "pes":
        return expirableOp(redisson.getPermitExpirableSemaphore(name), op, args);
      case "latch":
        return latchOp(redisson.getCountDownLatch(name), op, args);
      default:
        throw new IllegalArgumentException("unknown kind " + kind);
    }
  }

  private static RLock optionalLock(String getter, String name) throws Exception {
    try {
      return (RLock) RedissonClient.class.getMethod(getter, String.class).invoke(redisson, name);
    } catch (NoSuchMethodException e) {
      throw new UnsupportedOperationException(getter + " is not in this Redisson release");
    }
  }

  private static Object invoke(Object target, String method, Class<?>[] types, Object... values)
      throws Exception {
    Method m = target.getClass().getMethod(method, types);
    m.setAccessible(true);
    return m.invoke(target, values);
  }

  private static Object lockOp(RLock lock, String op, JsonNode args) throws Exception {
    long lease = ms(args, "lease", -1);
    switch (op) {
      case "lock":
        if (lease < 0) {
          lock.lock();
        } else {
          lock.lock(lease, TimeUnit.MILLISECONDS);
        }
        return null;
      case "tryLock":
        return lock.tryLock(ms(args, "wait", 0), lease, TimeUnit.MILLISECONDS);
      case "lockAndGetToken":
        return lease < 0
            ? invoke(lock, "lockAndGetToken", new Class<?>[0])
            : invoke(lock, "lockAndGetToken", new Class<?>[] {long.class, TimeUnit.class},
                lease, TimeUnit.MILLISECONDS);
      case "tryLockAndGetToken":
        return invoke(lock, "tryLockAndGetToken",
            new Class<?>[] {long.class, long.class, TimeUnit.class},
            ms(args, "wait", 0), lease, TimeUnit.MILLISECONDS);
      case "getToken":
        return invoke(lock, "getToken", new Class<?>[0]);
      case "unlock":
        lock.unlock();
        return null;
      case "forceUnlock":
        return lock.forceUnlock();
      case "isLocked":
        return lock.isLocked();
      case "isHeldByCurrentThread":
        return lock.isHeldByCurrentThread();
      case "remainTimeToLive":
        return lock.remainTimeToLive();
      case "getHoldCount":
        return lock.getHoldCount();
      case "turns":
        return turns(args, lock::lock, lock::unlock, () -> null);
      case "tokenTurns":
        {
          Long[] token = new Long[1];
          return turns(
              args,
              () -> token[0] = (Long) invoke(lock, "lockAndGetToken", new Class<?>[0]),
              lock::unlock,
              () -> token[0]);
        }
      default:
        throw new IllegalArgumentException("unknown lock op " + op);
    }
  }

  private interface Step {
    void run() throws Exception;
  }

  private interface Tag {
    Object get() throws Exception;
  }

  /**
   * args.n turns of: acquire; INCR args.inside (its value after must not pass args.limit, 1 by
   * default: an overlap otherwise); GET args.counter then SET it one higher; RPUSH args.log
   * "java:<args.label or tag>"; DECR args.inside; release. Returns the overlaps seen (the counter, read by the
   * test, shows lost updates).
   */
  private static Object turns(JsonNode args, Step acquire, Step release, Tag tag)
      throws Exception {
    long limit = ms(args, "limit", 1);
    RAtomicLong inside = redisson.getAtomicLong(args.path("inside").asText());
    RBucket<String> counter = redisson.getBucket(args.path("counter").asText(), StringCodec.INSTANCE);
    String log = args.path("log").asText("");
    String label = args.path("label").asText("");
    int overlaps = 0;
    for (int i = 0; i < args.path("n").asInt(); i++) {
      acquire.run();
      try {
        if (inside.incrementAndGet() > limit) {
          overlaps++;
        }
        String value = counter.get();
        counter.set(Long.toString((value == null ? 0 : Long.parseLong(value)) + 1));
        if (!log.isEmpty()) {
          redisson.getList(log, StringCodec.INSTANCE).add("java:" + (label.isEmpty() ? tag.get() : label));
        }
        inside.decrementAndGet();
      } finally {
        release.run();
      }
    }
    return overlaps;
  }

  private static Object semaphoreOp(RSemaphore sem, String op, JsonNode args) throws Exception {
    int permits = args.path("permits").asInt(1);
    switch (op) {
      case "acquire":
        sem.acquire(permits);
        return null;
      case "tryAcquire":
        return sem.tryAcquire(permits, ms(args, "wait", 0), TimeUnit.MILLISECONDS);
      case "release":
        sem.release(permits);
        return null;
      case "trySetPermits":
        return sem.trySetPermits(permits);
      case "addPermits":
        sem.addPermits(permits);
        return null;
      case "availablePermits":
        return sem.availablePermits();
      case "drainPermits":
        return sem.drainPermits();
      case "turns":
        return turns(args, () -> sem.acquire(1), () -> sem.release(1), () -> null);
      default:
        throw new IllegalArgumentException("unknown semaphore op " + op);
    }
  }

  private static Object expirableOp(RPermitExpirableSemaphore sem, String op, JsonNode args)
      throws Exception {
    long lease = ms(args, "lease", -1);
    switch (op) {
      case "acquire":
        return lease < 0 ? sem.acquire() : sem.acquire(lease, TimeUnit.MILLISECONDS);
      case "tryAcquire":
        return sem.tryAcquire(ms(args, "wait", 0), lease, TimeUnit.MILLISECONDS);
      case "release":
        sem.release(args.path("permit").asText());
        return null;
      case "tryRelease":
        return sem.tryRelease(args.path("permit").asText());
      case "trySetPermits":
        return sem.trySetPermits(args.path("permits").asInt());
      case "availablePermits":
        return sem.availablePermits();
      case "turns":
        {
          String[] permit = new String[1];
          return turns(
              args,
              () -> permit[0] = lease < 0 ? sem.acquire() : sem.acquire(lease, TimeUnit.MILLISECONDS),
              () -> sem.release(permit[0]),
              () -> null);
        }
      default:
        throw new IllegalArgumentException("unknown permit-expirable semaphore op " + op);
    }
  }

  private static Object latchOp(RCountDownLatch latch, String op, JsonNode args)
      throws Exception {
    switch (op) {
      case "trySetCount":
        return latch.trySetCount(args.path("count").asLong());
      case "countDown":
        latch.countDown();
        return null;
      case "getCount":
        return latch.getCount();
      case "await":
        return latch.await(ms(args, "timeout", 0), TimeUnit.MILLISECONDS);
      default:
        throw new IllegalArgumentException("unknown latch op " + op);
    }
  }
}
