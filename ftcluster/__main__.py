from ftcluster.cli import main

main()
