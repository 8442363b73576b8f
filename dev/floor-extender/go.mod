module rocshare.dev/floor-extender

go 1.22
