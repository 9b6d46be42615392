DEBUG = True
NAME = "app"
PORT = 8080
