"""The config's schema and where its files are: the bottom layer every other package reads."""
