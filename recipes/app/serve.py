def main():
    print("hello from the app")


if __name__ == "__main__":
    main()
