module github.com/tierlimit/tierlimit

go 1.22
