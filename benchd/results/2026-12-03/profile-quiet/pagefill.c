#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  size_t sz=(size_t)64<<20, np=sz/4096;
  // source file in tmpfs
  int fd=open("/dev/shm/touchsrc",O_RDWR|O_CREAT|O_TRUNC,0600); char*b=malloc(sz); memset(b,7,sz); write(fd,b,sz);
  for(int i=0;i<4;i++){
    char*p=mmap(0,sz,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
    double t=now(); pread(fd,p,sz,0); double a=now()-t; munmap(p,sz);
    p=mmap(0,sz,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
    t=now(); madvise(p,sz,MADV_POPULATE_WRITE); double b1=now()-t; t=now(); pread(fd,p,sz,0); double b2=now()-t; munmap(p,sz);
    p=mmap(0,sz,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
    t=now(); for(size_t j=0;j<sz;j+=4096)p[j]=1; double c=now()-t; munmap(p,sz);
    printf("pread-into-fresh %.2f us/page | populate %.2f + pread %.2f = %.2f | touch %.2f\n",a*1e6/np,b1*1e6/np,b2*1e6/np,(b1+b2)*1e6/np,c*1e6/np);
  }
  unlink("/dev/shm/touchsrc");
}
