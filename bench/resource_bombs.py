"""Resource bombs against a running `nyala serve` (started here from the binary given):
each statement of the robustness issue is sent with statement_timeout = 9s (a cancelled one
answers about 50 ms after its timeout, within the issue's 10 s) while another client runs
SELECT 1 every 50 ms; prints how each ended and the SELECT 1 latencies.

Usage: python3 bench/resource_bombs.py $CARGO_TARGET_DIR/release/nyala
"""
import sys
import subprocess, time, tempfile, socket, threading
import adbc_driver_flightsql.dbapi as flight_sql
binary=sys.argv[1]
d = tempfile.mkdtemp()
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
p = subprocess.Popen([binary, "serve", "--data-dir", d, "--listen", f"127.0.0.1:{port}", "--http-addr", "127.0.0.1:0", "--pg-addr", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
time.sleep(1.5)
def connect(): return flight_sql.connect(f"grpc://127.0.0.1:{port}")
lat=[]; stop=False
def pinger():
    c=connect(); cur=c.cursor()
    while not stop:
        t=time.time(); cur.execute("SELECT 1"); cur.fetchall(); lat.append(time.time()-t); time.sleep(0.05)
th=threading.Thread(target=pinger); th.start()
c=connect(); cur=c.cursor()
cur.execute("SET statement_timeout = '9s'"); cur.fetchall()
for q in ["SELECT count(*) FROM generate_series(1, 3000000000)",
          "SELECT sum(value) FROM generate_series(1, 3000000000)",
          "SELECT count(*) FROM generate_series(1, 1000000) a, generate_series(1, 1000000) b WHERE a.value + b.value = 7",
          "SELECT repeat('x', 2000000000)",
          "SELECT length(repeat('x', 20000000000))",
          "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
          "CREATE TABLE big (k BIGINT PRIMARY KEY) DISTRIBUTE BY HASH (k) INTO 100000 BUCKETS",
          "SELECT array_length(range(1, 3000000000))",
         ]:
    t=time.time()
    try:
        cur.execute(q); r=cur.fetchall(); res=f"ok {r[:2]}"
    except Exception as e: res="ERR "+str(e)[:200].replace("\n"," ")
    print(f"{time.time()-t:6.2f}s {q[:70]:70} → {res}", flush=True)
    if p.poll() is not None: print("DEAD", p.stderr.read().decode()[-500:]); break
stop=True; th.join()
lat.sort(); print("SELECT 1 during: n=%d p50=%.1fms p99=%.1fms max=%.1fms" % (len(lat), lat[len(lat)//2]*1000, lat[int(len(lat)*.99)]*1000, lat[-1]*1000))
p.kill()
