# Sends what it can to a listener on the machine's loopback, over UDP, from a thread.
import socket
import threading

CODE = '''
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b"REDTEAM-UDP", ("127.0.0.1", @PORT@))
'''
t = threading.Thread(target=exec, args=(compile(CODE, "/usr/lib/python3.11/socket.py", "exec"), {"socket": socket}))
t.start()
t.join()
