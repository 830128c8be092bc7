# Connects to a listener on the machine's loopback over TCP, from a thread under another file name.
import socket
import threading

CODE = '''
s = socket.create_connection(("127.0.0.1", @PORT@), timeout=2)
s.sendall(b"REDTEAM-TCP")
'''
t = threading.Thread(target=exec, args=(compile(CODE, "/usr/lib/python3.11/socket.py", "exec"), {"socket": socket}))
t.start()
t.join()
