# Creates a database beside the grader's code (a write outside the sandbox, through sqlite's C code).
import sqlite3

db = sqlite3.connect("@REPO@/grader/planted.db")
db.execute("create table t (x)")
db.commit()
