DEBUG = False
NAME = "app"
PORT = 8080
